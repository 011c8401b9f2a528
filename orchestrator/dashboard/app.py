"""The dashboard's HTTP side (Starlette): the page, its event stream, JSON for scripts. Read-only.

  GET /                           the page, following the latest run (or the one of --run)
  GET /runs/{run_id}              the page of one run
  GET /api/runs                   every run of the state directory with its outcome
  GET /api/status                 `status --json` of the page's run
  GET /api/runs/{run_id}/status   `status --json` of that run
  GET /api/runs/{run_id}/dashboard  everything the page shows, as one document
  GET /api/runs/{run_id}/logs     the recent log lines, each with its `tail` prefix
  GET /api/runs/{run_id}/events   server-sent events: `dashboard` documents and `log` lines

With a token (any address but loopback), every request must carry it: `?token=` or
`Authorization: Bearer`. An unknown run is a 404 with a message.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from anyio import to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.dashboard.watch import Hub, RunWatch

KEEPALIVE = 15.0
STATIC = {"app.js": "text/javascript", "style.css": "text/css"}


def _asset(name: str) -> str:
    return resources.files("orchestrator.dashboard").joinpath("static", name).read_text("utf-8")


class TokenGate:
    """Checks the token on every request, before any route runs."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            request = Request(scope)
            given = request.query_params.get("token") or ""
            auth = request.headers.get("authorization", "")
            if auth.lower().startswith("bearer "):
                given = auth[7:]
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                response = JSONResponse(
                    {"error": "a valid token is required: open the URL the dashboard printed"},
                    status_code=401,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(hub: Hub, token: str | None = None) -> ASGIApp:
    def missing(run_id: str, html: bool = False) -> Response:
        message = f"no run '{run_id}' in {hub.store.root.resolve()}"
        if html:
            return HTMLResponse(f"<h1>404</h1><p>{message}</p>", status_code=404)
        return JSONResponse({"error": message}, status_code=404)

    def no_run() -> Response:
        return JSONResponse(
            {"error": f"no run yet in {hub.store.root.resolve()}: start one with 'orchestrate up'"},
            status_code=404,
        )

    def page(run_id: str | None, follow: bool, request: Request) -> Response:
        query = f"?token={token}" if token else ""
        settings = json.dumps({"run": run_id, "follow": follow, "token": token})
        html = (
            _asset("index.html")
            .replace("{{query}}", query)
            .replace("{{settings}}", settings.replace("</", "<\\/"))
        )
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    async def index(request: Request) -> Response:
        return page(hub.default_run(), hub.pinned is None, request)

    async def run_page(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        if not hub.exists(run_id):
            return missing(run_id, html=True)
        return page(run_id, False, request)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return JSONResponse({"error": f"no file {name}"}, status_code=404)
        return Response(_asset(name), media_type=STATIC[name])

    def watched(request: Request) -> RunWatch | Response:
        run_id = request.path_params.get("run_id") or hub.default_run()
        if run_id is None:
            return no_run()
        if not hub.exists(run_id):
            return missing(run_id)
        return hub.watch(run_id)

    async def runs(request: Request) -> Response:
        def summaries() -> list[dict[str, Any]]:
            from orchestrator.dashboard.model import run_summary
            from orchestrator.engine.snapshot import read_snapshot

            current = hub.store.current_id()
            return [
                run_summary(hub.store.load(r), read_snapshot(hub.store, r), current)
                for r in reversed(hub.store.run_ids())
            ]

        return JSONResponse({"runs": await to_thread.run_sync(summaries)})

    async def status(request: Request) -> Response:
        watch = watched(request)
        if isinstance(watch, Response):
            return watch
        document = await to_thread.run_sync(watch.document)
        return JSONResponse(document.get("status") or {"error": document.get("error")})

    async def dashboard(request: Request) -> Response:
        watch = watched(request)
        if isinstance(watch, Response):
            return watch
        return JSONResponse(await to_thread.run_sync(watch.document))

    async def logs(request: Request) -> Response:
        watch = watched(request)
        if isinstance(watch, Response):
            return watch
        return JSONResponse({"lines": await to_thread.run_sync(watch.log_lines)})

    async def events(request: Request) -> Response:
        watch = watched(request)
        if isinstance(watch, Response):
            return watch
        return StreamingResponse(
            _stream(watch),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    routes = [
        Route("/", index),
        Route("/runs/{run_id}", run_page),
        Route("/static/{name}", static),
        Route("/api/runs", runs),
        Route("/api/status", status),
        Route("/api/runs/{run_id}/status", status),
        Route("/api/runs/{run_id}/dashboard", dashboard),
        Route("/api/runs/{run_id}/logs", logs),
        Route("/api/runs/{run_id}/events", events),
    ]
    app: ASGIApp = Starlette(routes=routes)
    return TokenGate(app, token) if token else app


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
