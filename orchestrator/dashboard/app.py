"""The dashboard's HTTP side (Starlette): the page, its event stream, JSON for scripts. Read-only.

  GET /                           the page, following the latest run (or the one of --run)
  GET /runs/{run_id}              the page of one run
  GET /api/runs                   every run of the state directory with its outcome
  GET /api/status                 `status --json` of the page's run
  GET /api/runs/{run_id}/status   `status --json` of that run
  GET /api/runs/{run_id}/dashboard  everything the page shows, as one document
  GET /api/runs/{run_id}/logs     the recent log lines, each with its `tail` prefix
  GET /api/runs/{run_id}/events   server-sent events: `dashboard` documents and `log` lines

Who may ask is checked first (auth.Guard: the Host allowlist on loopback, the token, which is
there by default on every bind, and the security headers). An unknown run, or a name that is
not a run id, is a 404 with a message that echoes nothing unescaped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from html import escape
from importlib import resources
from typing import Any

from anyio import to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from starlette.types import ASGIApp

from orchestrator.dashboard.auth import Guard
from orchestrator.dashboard.watch import Hub, RunWatch, run_summaries
from orchestrator.engine.supervision.hangs import kept as kept_stacks

KEEPALIVE = 15.0
STATIC = {
    "app.js": "text/javascript",
    "style.css": "text/css",
    "favicon.svg": "image/svg+xml",
    "enter.js": "text/javascript",
}


def _asset(name: str) -> str:
    return resources.files("orchestrator.dashboard").joinpath("static", name).read_text("utf-8")


def create_app(
    hub: Hub, token: str | None = None, port: int = 0, hosts: frozenset[str] | None = None
) -> ASGIApp:
    """The routes behind the Guard: `token` None goes without one, `hosts` None takes any Host."""
    return Guard(Starlette(routes=_Handlers(hub).routes()), token, port, hosts)


class _Handlers:
    """The routes' handlers over one hub."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def routes(self) -> list[Route]:
        return [
            Route("/", self.index),
            Route("/runs/{run_id}", self.run_page),
            Route("/static/{name}", self.static),
            Route("/api/runs", self.runs),
            Route("/api/status", self.status),
            Route("/api/runs/{run_id}/status", self.status),
            Route("/api/runs/{run_id}/dashboard", self.dashboard),
            Route("/api/runs/{run_id}/logs", self.logs),
            Route("/api/runs/{run_id}/events", self.events),
            Route("/api/runs/{run_id}/stacks/{attempt}/{worker}", self.stacks),
        ]

    # -- the page and its files ---------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        return self._page(self.hub.default_run(), self.hub.pinned is None)

    async def run_page(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        if not self.hub.exists(run_id):
            return self._missing(run_id, html=True)
        return self._page(run_id, False)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return JSONResponse({"error": "no such file"}, status_code=404)
        return Response(_asset(name), media_type=STATIC[name])

    def _page(self, run_id: str | None, follow: bool) -> Response:
        settings = json.dumps({"run": run_id, "follow": follow})
        # JSON inside <script>: no character of it may close the element or open a comment.
        for character, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
            settings = settings.replace(character, escaped)
        html = _asset("index.html").replace("{{settings}}", settings)
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    # -- JSON and events ----------------------------------------------------------------------

    async def runs(self, request: Request) -> Response:
        return JSONResponse({"runs": await to_thread.run_sync(self._summaries)})

    async def status(self, request: Request) -> Response:
        watch = self._watched(request)
        if isinstance(watch, Response):
            return watch
        document = await to_thread.run_sync(watch.document)
        status = document.get("status")
        if not status:
            return JSONResponse({"error": document.get("error")})
        # As `status --json` has it: the run's goodput account (the page's line and bar aside).
        account = {k: v for k, v in (document.get("goodput") or {}).items()
                   if k not in ("line", "bar")}  # fmt: skip
        return JSONResponse({**status, "goodput": account, "tracking": document.get("tracking"),
                             "supervised": document.get("supervised")})  # fmt: skip

    async def dashboard(self, request: Request) -> Response:
        watch = self._watched(request)
        if isinstance(watch, Response):
            return watch
        return JSONResponse(await to_thread.run_sync(watch.document))

    async def logs(self, request: Request) -> Response:
        watch = self._watched(request)
        if isinstance(watch, Response):
            return watch
        return JSONResponse({"lines": await to_thread.run_sync(watch.log_lines)})

    async def events(self, request: Request) -> Response:
        watch = self._watched(request)
        if isinstance(watch, Response):
            return watch
        return StreamingResponse(
            _stream(watch),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def stacks(self, request: Request) -> Response:
        """The stacks kept for a worker at the stall that ended an attempt, as plain text. The
        file is looked up among those kept (hangs.kept), never built from the request's path."""
        run_id = request.path_params["run_id"]
        if not self.hub.exists(run_id):
            return self._missing(run_id)
        attempt, worker = request.path_params["attempt"], request.path_params["worker"]
        kept = await to_thread.run_sync(kept_stacks, self.hub.store, run_id)
        path = kept.get(int(attempt), {}).get(worker) if attempt.isdigit() else None
        if path is None:
            return JSONResponse({"error": f"no stacks kept for {worker!r} at attempt {attempt!r}"},
                                status_code=404)  # fmt: skip
        text = await to_thread.run_sync(lambda: path.read_text(encoding="utf-8", errors="replace"))
        return PlainTextResponse(text, headers={"X-Content-Type-Options": "nosniff",
                                                "Cache-Control": "no-store"})  # fmt: skip

    def _summaries(self) -> list[dict[str, Any]]:
        return run_summaries(self.hub.store)

    def _watched(self, request: Request) -> RunWatch | Response:
        """The watch of the request's run (else the page's), or the 404 that says why not."""
        run_id = request.path_params.get("run_id") or self.hub.default_run()
        if run_id is None:
            return self._no_run()
        if not self.hub.exists(run_id):
            return self._missing(run_id)
        return self.hub.watch(run_id)

    # -- 404s ---------------------------------------------------------------------------------

    def _missing(self, run_id: str, html: bool = False) -> Response:
        """The state directory's path stays out: the page says what is wrong, not where."""
        if not self.hub.is_run_id(run_id):
            message = f"'{run_id[:80]}' is not a run id (they read like 20260102-030405-abcd)"
        else:
            message = f"no run '{run_id}' in this dashboard's state directory"
        if html:
            page = (
                '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>404</title>'
                f'</head><body><h1>404</h1><p>{escape(message)}</p><p><a href="/">the latest '
                "run</a></p></body></html>"
            )
            return HTMLResponse(page, status_code=404)
        return JSONResponse({"error": message}, status_code=404)

    def _no_run(self) -> Response:
        return JSONResponse(
            {"error": "no run yet in this state directory: start one with 'orchestrate up'"},
            status_code=404,
        )


async def _stream(watch: RunWatch) -> AsyncIterator[str]:
    queue = watch.subscribe()
    try:
        yield "retry: 2000\n\n"
        while True:
            try:
                event, data = await asyncio.wait_for(queue.get(), KEEPALIVE)
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            yield f"event: {event}\ndata: {data}\n\n"
    finally:
        watch.unsubscribe(queue)
