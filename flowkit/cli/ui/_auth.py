"""The dashboard's security (docs/ui.md): the token a browser presents once (then a
cookie holding a key derived from it), the CSRF value of the action forms, the same-origin
check of every ``POST``, and the headers every response carries."""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlencode, urlsplit

from starlette.requests import Request

__all__ = [
    "COOKIE",
    "SECURITY_HEADERS",
    "SESSION_SECONDS",
    "Keys",
    "cookie_name",
    "same_origin",
    "url_without_token",
]

COOKIE = "flowkit_ui"
"""The login cookie's name, ``flowkit_ui_<port>`` when the dashboard's URL has a port
(``cookie_name``): cookies ignore ports, so two dashboards on one host would otherwise log
each other out."""


SESSION_SECONDS = 12 * 3600
"""How long a login lasts: the cookie's ``Max-Age``, and the expiry signed into its value (a
copy of the value stops working then too, whatever the browser does with it)."""


def cookie_name(request: Request) -> str:
    """The login cookie of the dashboard this request reached (``COOKIE``)."""
    port = request.url.port
    return COOKIE if port is None else f"{COOKIE}_{port}"


SECURITY_HEADERS = {
    # no inline script or style, nothing from elsewhere (all JS and CSS under /static)
    "Content-Security-Policy": "default-src 'self'",
    "X-Frame-Options": "DENY",  # (no framing: clickjacking of the action buttons)
    "X-Content-Type-Options": "nosniff",
    # (not no-referrer: a browser then sends `Origin: null` with a form post, which the
    # same-origin check refuses; same-origin keeps a ?token= URL from leaking elsewhere)
    "Referrer-Policy": "same-origin",
}


class Keys:
    """What the token derives: the cookie value (so the cookie never holds the token itself:
    its expiry and an HMAC of the token over it) and the CSRF value of the action forms (another
    HMAC of the token)."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.csrf = self._mac(b"flowkit-ui csrf")

    def _mac(self, what: bytes) -> str:
        return hmac.new(self.token.encode(), what, hashlib.sha256).hexdigest()

    def session(self, now: float) -> str:
        """A login cookie's value, good for ``SESSION_SECONDS`` from ``now``."""
        expires = int(now) + SESSION_SECONDS
        return f"{expires}.{self._mac(b'flowkit-ui session %d' % expires)}"

    def token_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.token.encode())

    def cookie_ok(self, request: Request, now: float) -> bool:
        """Whether the request carries a login cookie of this token, not expired at ``now``."""
        got = request.cookies.get(cookie_name(request), "")
        stamp, sep, mac = got.partition(".")
        if not sep or not stamp.isdigit() or len(stamp) > 12:
            return False
        want = self._mac(b"flowkit-ui session %d" % int(stamp))
        return hmac.compare_digest(mac.encode(), want.encode()) and int(stamp) > now

    def csrf_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.csrf.encode())


def same_origin(request: Request) -> bool:
    """Whether a ``POST`` comes from the dashboard's own pages: an ``Origin`` header (browsers
    send one on every POST) must name this very host; a cross-site ``Sec-Fetch-Site`` is
    refused too. A request with neither (curl, scripts) passes: the CSRF value still guards
    it."""
    if request.headers.get("sec-fetch-site", "") == "cross-site":
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    parts = urlsplit(origin)
    host = request.headers.get("host", "")
    return parts.scheme in ("http", "https") and parts.netloc == host and bool(host)


def url_without_token(request: Request) -> str:
    """The request's path and query without ``token`` (where a login redirects to)."""
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    return request.url.path + ("?" + urlencode(rest) if rest else "")
