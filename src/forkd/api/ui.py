"""The web console at ``/ui``: a few static files (plain ES modules and CSS,
package data in ``ui_static/``) that call the REST API from the browser.

The files hold no data and no secret, so they are served without the token
(the browser needs them to show the login form); everything they show comes
from the API, which needs the bearer token as always. The page keeps the token
in ``sessionStorage`` and sends it as an ``Authorization`` header, never in a
URL or a cookie, so there is nothing for another site to ride on (no CSRF) and
nothing in access logs. A strict Content-Security-Policy allows only these
files' own scripts and styles, and the scripts build the page with DOM calls
(``textContent``), never by parsing strings as HTML.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Response

from forkd.api.auth import UNAUTHENTICATED_PREFIX
from forkd.errors import NotFound

# forkd.api.auth exempts this prefix from the token (UNAUTHENTICATED_PREFIX).
UI_PREFIX = UNAUTHENTICATED_PREFIX
INDEX = "index.html"

_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# style-src 'unsafe-inline': xterm.js (the terminal) sizes and colours its rows with <style>
# elements it makes; styles cannot run code, and scripts stay 'self' only.
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _assets() -> dict[str, bytes]:
    """Every file of the console by name, read once: the only names ``/ui/`` serves."""
    folder = resources.files("forkd.api").joinpath("ui_static")
    return {
        entry.name: entry.read_bytes()
        for entry in folder.iterdir()
        if entry.is_file() and any(entry.name.endswith(suffix) for suffix in _CONTENT_TYPES)
    }


# Third-party browser code, from npm (ui_vendor/package.json, installed by `make node-deps`, never
# committed): served at /ui/vendor/<name> when installed.
VENDOR = {"xterm.mjs": "@xterm/xterm/lib/xterm.mjs", "xterm.css": "@xterm/xterm/css/xterm.css"}


def _vendor() -> dict[str, bytes]:
    modules = resources.files("forkd.api").joinpath("ui_vendor").joinpath("node_modules")
    out = {}
    for name, path in VENDOR.items():
        entry = modules.joinpath(path)
        if entry.is_file():
            out[name] = entry.read_bytes()
    return out


def make_router() -> APIRouter:
    assets = _assets()
    vendor = _vendor()
    router = APIRouter(include_in_schema=False)

    def serve(name: str) -> Response:
        body = assets.get(name)
        if body is None:
            raise NotFound(f"no console file {name!r}; the console is at {UI_PREFIX}")
        suffix = name[name.rindex("."):]
        return Response(body, media_type=_CONTENT_TYPES[suffix], headers=_SECURITY_HEADERS)

    @router.get(UI_PREFIX)
    @router.get(UI_PREFIX + "/")
    def index() -> Response:
        return serve(INDEX)

    @router.get(UI_PREFIX + "/vendor/{name}")
    def vendored(name: str) -> Response:
        body = vendor.get(name)
        if body is None:
            missing = ": the console's npm packages are not installed; run `make node-deps`"
            raise NotFound(f"no console file vendor/{name!r}" + (missing if name in VENDOR else ""))
        return Response(body, media_type=_CONTENT_TYPES[name[name.rindex("."):]], headers=_SECURITY_HEADERS)

    @router.get(UI_PREFIX + "/{name}")
    def asset(name: str) -> Response:
        return serve(name)

    return router
