"""The layers of flowkit point one way (docs/architecture.md): each layer is a package of the
tree, the import graph of its modules has no circle, and no module imports a layer above its own.

Every import counts: at module level, inside functions and under ``TYPE_CHECKING``. A static
read of the source rather than an import in a fresh interpreter: importing
``flowkit.stores.memory`` runs ``flowkit/__init__`` first, which imports every layer, so
``sys.modules`` could not tell the layers apart."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The layers, lowest first: a module may import its own layer and the layers before it. A
# layer is a package of flowkit (``flowkit/_core/``, ...), so the tree shows the layering.
LAYERS = ("_core", "_model", "stores", "_replay", "_worker", "_client", "cli")
# The public modules at the top of the package (their import paths are the API), each the face
# of one layer.
PUBLIC = {
    "errors": "_core",
    "singleton": "_core",
    "logging": "_core",
    "events": "_core",
    "otel": "cli",
}
# what a layer must never import although it comes later in LAYERS
FORBIDDEN = {"_replay": ("stores",)}
# The only edges allowed to close a circle, each an import for the annotations only (under
# ``TYPE_CHECKING``) of the module that calls this one, with its reason. No import points to a
# higher layer, and no circle exists among the imports that run.
_ENGINE = "annotations only: an ``Engine`` method delegates here and passes the engine"
KNOWN: dict[tuple[str, str], str] = {
    ("flowkit._client.publish", "flowkit._client.engine"): _ENGINE,
    ("flowkit._client.retry", "flowkit._client.engine"): _ENGINE,
    ("flowkit._client.schedules", "flowkit._client.engine"): _ENGINE,
    ("flowkit._client.search", "flowkit._client.engine"): _ENGINE,
    ("flowkit._client.serve", "flowkit._client.engine"): _ENGINE,
    ("flowkit._client.updates", "flowkit._client.engine"): _ENGINE,
    ("flowkit._replay.branch", "flowkit._replay.state"): (
        "annotations only: ``CURRENT`` holds the ``ActivationState`` that creates branches"
    ),
    ("flowkit._replay.state", "flowkit._replay.children"): (
        "annotations only: the state keeps the child calls that read it"
    ),
    ("flowkit.stores.memory._events", "flowkit.stores.memory"): (
        "annotations only: the events part of ``MemoryStore`` reads the store's ``_Data``"
    ),
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module(p): p for p in sorted((ROOT / "flowkit").rglob("*.py"))}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None
    top = parts[1]
    if top in LAYERS:
        return top
    return PUBLIC.get(top)


def _import_nodes(
    nodes: list[ast.stmt], typing_only: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement under ``nodes`` (functions and classes included), with whether it
    stands under ``if TYPE_CHECKING:`` (an import for the annotations only)."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, typing_only
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _import_nodes(node.body, True)
            yield from _import_nodes(node.orelse, typing_only)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, ()):
                    if isinstance(child, ast.stmt):
                        yield from _import_nodes([child], typing_only)
                    else:  # (an except handler, a match case)
                        yield from _import_nodes(child.body, typing_only)


def _imports(module: str) -> dict[str, bool]:
    """Every flowkit module ``module`` imports, wherever the import statement stands, each with
    whether it is imported for the annotations only."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, bool] = {}

    def add(dep: str, typing_only: bool) -> None:
        found[dep] = found.get(dep, True) and typing_only

    for node, typing_only in _import_nodes(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            for a in node.names:
                name = a.name
                while name and name not in MODULES:
                    name = name.rpartition(".")[0]
                if name:
                    add(name, typing_only)
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            subs = {f"{target}.{a.name}" for a in node.names} & MODULES.keys()
            for sub in subs:
                add(sub, typing_only)
            if target in MODULES and len(subs) < len(node.names):
                add(target, typing_only)  # (a name of the module itself, not only submodules)
    found.pop(module, None)
    return found


GRAPH = {m: _imports(m) for m in MODULES}


def test_every_module_is_in_a_layer_package() -> None:
    unplaced = [m for m in MODULES if m != "flowkit" and _layer(m) is None]
    assert unplaced == [], "put them in a layer's package (and name them in docs/architecture.md)"


def test_every_layer_is_a_package_of_the_tree() -> None:
    packages = {p.parent.name for p in (ROOT / "flowkit").glob("*/__init__.py")}
    assert packages == set(LAYERS)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "flowkit"))
def test_no_module_imports_a_layer_above_its_own(module: str) -> None:
    mine = _layer(module)
    assert mine is not None
    for dep in sorted(GRAPH[module]):
        assert dep != "flowkit", f"{module} imports the flowkit package (a cycle with it)"
        theirs = _layer(dep)
        assert theirs is not None
        where = f"{module} ({mine}) imports {dep} ({theirs})"
        assert LAYERS.index(theirs) <= LAYERS.index(mine), where
        assert theirs not in FORBIDDEN.get(mine, ()), where


def test_the_known_exceptions_are_imports_for_annotations_still_made() -> None:
    stale = [pair for pair in KNOWN if pair[1] not in GRAPH.get(pair[0], {})]
    assert stale == [], "no longer imported: drop them from KNOWN"
    running = [pair for pair in KNOWN if not GRAPH[pair[0]][pair[1]]]
    assert running == [], "imported outside TYPE_CHECKING: a real circle"


def test_the_import_graph_has_no_circle() -> None:
    """No circle, through package ``__init__`` modules and function-level imports too."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for dep in sorted(GRAPH[m]):
            if (m, dep) in KNOWN:
                continue
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m)
