"""Who may read the dashboard, checked before any route runs (as Jupyter does it):

- on a loopback bind, only requests addressed to a loopback name (127.0.0.1, localhost, [::1],
  the bound address, with the port) are answered: a web page on a domain that rebinds to
  127.0.0.1 gets a 403, not the runs. Off loopback the token is the gate.
- with a token (the default on every bind), a request carries it in the HttpOnly SameSite=Strict
  cookie `orchestrate-token-PORT` (browsers do not separate cookies by port) or, from scripts, as
  `Authorization: Bearer TOKEN`. The first visit brings it as `?token=`: it is exchanged for the
  cookie and the browser is sent to the same URL without it, by a 303; after a link from another
  site by a page of ours that moves on itself (a redirect would stay cross-site, and the Strict
  cookie unsent). A page visit without it gets a form that asks for the token; an API call a
  JSON 401.
- every answer carries a Content-Security-Policy (`default-src 'self'; frame-ancestors 'none'`),
  `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`.

The token is kept in the state directory's `dashboard-token` (0600, ours, not a link), so every
dashboard of that directory shares it, a restarted one keeps the browser's cookie valid, and
scripts can read it. Removing the file makes the next dashboard choose a new one.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterable
from html import escape
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,128}")
LOGIN_PATH = "/login"
PUBLIC = ("/static/favicon.svg", "/static/enter.js")  # what the pages before the cookie need
FORM_LIMIT = 4096  # bytes of a login form's body: a token and a path


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cookie_name(port: int) -> str:
    return f"orchestrate-token-{port}"


def allowed_hosts(bound: str, port: int) -> frozenset[str] | None:
    """The Host headers a dashboard bound to `bound`:`port` answers; None (any) off loopback,
    where the token is what keeps others out."""
    if not is_loopback(bound):
        return None
    names = {"127.0.0.1", "localhost", "[::1]", f"[{bound}]" if ":" in bound else bound}
    hosts = {f"{name}:{port}" for name in names}
    if port == 80:
        hosts |= names  # a browser leaves out the default port
    return frozenset(host.lower() for host in hosts)


def other_users(logged_in: Iterable[str], me: str) -> list[str]:
    """Who else is logged in to this machine (as `psutil.users()` names them)."""
    return sorted({name for name in logged_in if name and name != me})


def new_token() -> str:
    return secrets.token_urlsafe(24)


def stored_token(path: Path) -> str:
    """The token of `path` if it is a sound one (a regular file of ours that only we may read,
    holding a token); else a new one, written there 0600 through a temporary file of a random
    name (created O_EXCL), never through a link someone left at `path`."""
    token = _read_own(path)
    if token is not None:
        return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = new_token()
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600
    try:
        with os.fdopen(handle, "w", encoding="ascii") as file:
            file.write(token + "\n")
        try:
            os.link(temporary, path)  # only if absent: two dashboards starting at once agree
        except FileExistsError:
            theirs = _read_own(path)
            if theirs is not None:
                return theirs
            os.replace(temporary, path)  # replaces a link or a file not ours, follows neither
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
    return token


def _read_own(path: Path) -> str | None:
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(handle, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            return None
        text = file.read(256).decode("ascii", errors="replace").strip()
    return text if TOKEN_PATTERN.fullmatch(text) else None


class Guard:
    """The Host allowlist, the token and the security headers, around the whole app."""

    def __init__(
        self, app: ASGIApp, token: str | None, port: int, hosts: frozenset[str] | None
    ) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie_name(port)
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        answer = await self._refusal(Request(scope, receive))
        if answer is not None:
            await answer(scope, receive, send_with_headers)
        else:
            await self.app(scope, receive, send_with_headers)

    async def _refusal(self, request: Request) -> Response | None:
        """The answer that stands in for the route's, or None to let the route answer."""
        if self.hosts is not None and request.headers.get("host", "").lower() not in self.hosts:
            return PlainTextResponse(
                "refused: this dashboard answers only to requests for its own loopback address "
                "(127.0.0.1, localhost or [::1] with its port); open the URL it printed",
                status_code=403,
            )
        if self.token is None or request.url.path in PUBLIC:
            return None
        if request.url.path == LOGIN_PATH and request.method == "POST":
            return await self._login(request)
        offered = request.query_params.get("token")
        if offered is not None and self._valid(offered):
            # The token leaves the address bar; arriving by a link from another site, a
            # redirect would still count as cross-site and the Strict cookie would not be sent.
            cross_site = request.headers.get("sec-fetch-site") == "cross-site"
            return self._admit(_without_token(request), by_page=cross_site)
        if self._valid(request.cookies.get(self.cookie, "")) or self._valid(_bearer(request)):
            return None
        if request.url.path.startswith("/api/") or request.method != "GET":  # scripts
            return Response(
                json.dumps({"error": "a valid token is required: send 'Authorization: Bearer "
                            "TOKEN' (the token is in .orchestrate/dashboard-token)"}),
                status_code=401,
                media_type="application/json",
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
        wrong = "That token is not this dashboard's." if offered is not None else ""
        return _login_page(_without_token(request), wrong)

    async def _login(self, request: Request) -> Response:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > FORM_LIMIT:
                return PlainTextResponse("the form is too large", status_code=413)
        form = dict(parse_qsl(body.decode("utf-8", errors="replace")))
        target = _local_path(form.get("next", "/"))
        if not self._valid(form.get("token", "").strip()):
            return _login_page(target, "That token is not this dashboard's.")
        return self._admit(target)

    def _admit(self, target: str, by_page: bool = False) -> Response:
        """The cookie, and on to `target`: by a 303, or (`by_page`) by a page of ours that
        moves on itself, which makes the next request same-site."""
        answer: Response
        if by_page:
            link = escape(target)
            answer = HTMLResponse(
                f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
                f'<meta http-equiv="refresh" content="2;url={link}"><title>orchestrate</title>'
                f'</head><body><p><a id="next" href="{link}">Open the dashboard</a></p>'
                '<script src="/static/enter.js"></script></body></html>'
            )  # enter.js replaces this entry of the history: the tokened address goes
        else:
            answer = RedirectResponse(target, status_code=303)
        answer.set_cookie(self.cookie, self.token or "", httponly=True, samesite="strict", path="/")
        answer.headers["cache-control"] = "no-store"
        return answer

    def _valid(self, given: str) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), (self.token or "").encode())


def _bearer(request: Request) -> str:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _without_token(request: Request) -> str:
    query = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
    return request.url.path + (f"?{query}" if query else "")


def _local_path(target: str) -> str:
    """A path on this dashboard to go back to; anything else (another site, `//host`) is `/`."""
    if not target.startswith("/") or target.startswith(("//", "/\\")) or "\\" in target:
        return "/"
    return target if target.isprintable() else "/"


def _login_page(target: str, problem: str) -> Response:
    message = f'<p role="alert"><strong>{escape(problem)}</strong></p>' if problem else ""
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>orchestrate dashboard: token</title>
<link rel="icon" href="/static/favicon.svg"></head>
<body><h1>orchestrate dashboard</h1>{message}
<p>This dashboard needs its token. Open the URL that <code>orchestrate dashboard</code> (or
<code>up --dashboard</code>) printed, or paste the token, which is also in
<code>.orchestrate/dashboard-token</code>:</p>
<form method="post" action="{LOGIN_PATH}">
<input type="hidden" name="next" value="{escape(_local_path(target))}">
<label>Token <input id="token" name="token" type="password" autocomplete="off" autofocus
required></label> <button type="submit">Open</button></form></body></html>
"""
    return HTMLResponse(page, status_code=401, headers={"cache-control": "no-store"})
