"""The layers of flowkit point one way (docs/architecture.md): the import graph of its modules,
read from their source, has no circle, and no module imports a layer above its own.

A static read of the imports (module level, ``TYPE_CHECKING`` blocks left out) rather than an
import in a fresh interpreter: importing ``flowkit.stores.memory`` runs ``flowkit/__init__``
first, which imports every layer, so ``sys.modules`` could not tell the layers apart."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# lowest first; a module may import its own layer and the layers before it
LAYERS: dict[str, tuple[str, ...]] = {
    "base": (
        "flowkit.errors",
        "flowkit._boot",
        "flowkit._clock",
        "flowkit._eager",
        "flowkit._annotations",
        "flowkit._limits",
        "flowkit._run",
        "flowkit._search_terms",
        "flowkit._serde",
        "flowkit._event_keys",
        "flowkit._browse_types",
        "flowkit.singleton",
        "flowkit.logging",
        "flowkit._telemetry",
    ),
    "definition": (
        "flowkit._definition",
        "flowkit._context",
        "flowkit._versions",
        "flowkit._payloads",
    ),
    "events": ("flowkit.events", "flowkit._history"),
    "stores": ("flowkit.stores",),
    "replay": ("flowkit._replay",),
    "engine": (
        "flowkit._bus",
        "flowkit._gate",
        "flowkit._recovery",
        "flowkit._threads",
        "flowkit._seat",
        "flowkit._children",
        "flowkit._cancel",
        "flowkit._bounds",
        "flowkit._host",
        "flowkit._continue",
        "flowkit._recheck",
        "flowkit._drive",
        "flowkit._retention",
        "flowkit._worker",
        "flowkit._history_wait",
        "flowkit._retry",
        "flowkit._schemas",
    ),
    "client": (
        "flowkit._results",
        "flowkit._search",
        "flowkit._retention",
        "flowkit._publish",
        "flowkit._updates",
        "flowkit._timetable",
        "flowkit._schedules",
        "flowkit._serve",
        "flowkit._browse",
        "flowkit._engine",
    ),
    "tools": (
        "flowkit.cli",
        "flowkit._cli_out",
        "flowkit._cli_common",
        "flowkit._cli_schedules",
        "flowkit._cli_search",
        "flowkit._cli_worker",
        "flowkit._cli_ui",
        "flowkit._ui",
        "flowkit.otel",
        "flowkit.ui",
    ),
}
ORDER = list(LAYERS)
# what a layer must never import although it comes later in ORDER
FORBIDDEN = {"replay": ("stores",)}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module(p): p for p in sorted((ROOT / "flowkit").rglob("*.py"))}


def _layer(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for layer, prefixes in LAYERS.items():
        for prefix in prefixes:
            inside = module == prefix or module.startswith(prefix + ".")
            if inside and (best is None or len(prefix) > best[0]):
                best = (len(prefix), layer)
    return best[1] if best else None


def _statements(nodes: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, into ``if``/``try`` bodies, without ``if TYPE_CHECKING:``."""
    for node in nodes:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _statements(block)
            for handler in node.handlers:
                yield from _statements(handler.body)
        else:
            yield node


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _statements(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            subs = {f"{target}.{a.name}" for a in node.names} & MODULES.keys()
            found.update(subs)
            if target in MODULES and len(subs) < len(node.names):
                found.add(target)  # (a name of the module itself, not only its submodules)
    found.discard(module)
    return found


GRAPH = {m: _imports(m) for m in MODULES}


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in MODULES if m != "flowkit" and _layer(m) is None]
    assert unplaced == [], "add them to LAYERS (and to docs/architecture.md)"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "flowkit"))
def test_no_module_imports_a_layer_above_its_own(module: str) -> None:
    mine = _layer(module)
    assert mine is not None
    for dep in sorted(GRAPH[module]):
        theirs = _layer(dep)
        if dep == "flowkit" or theirs is None:
            assert dep != "flowkit", f"{module} imports the flowkit package (a cycle with it)"
            continue
        where = f"{module} ({mine}) imports {dep} ({theirs})"
        assert ORDER.index(theirs) <= ORDER.index(mine), where
        assert theirs not in FORBIDDEN.get(mine, ()), where


def test_the_import_graph_has_no_circle() -> None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for dep in sorted(GRAPH[m]):
            if dep == "flowkit" or MODULES[dep].name == "__init__.py":
                continue  # a package's __init__ re-exports: importing a sibling through it is fine
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
