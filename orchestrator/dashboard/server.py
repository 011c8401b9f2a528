"""Serve the dashboard with uvicorn on a socket bound here, so a busy port is our error message."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import uvicorn

from orchestrator.dashboard.app import create_app
from orchestrator.dashboard.auth import allowed_hosts, is_loopback
from orchestrator.dashboard.watch import Hub
from orchestrator.engine.store.runstore import RunStore
from orchestrator.errors import MissingTool


def may_go_without_token(host: str) -> bool:
    """Only a loopback bind may go without a token (`--no-token`): anything else is reachable
    by other machines. (Loopback is not private on a shared machine either: hence the default.)"""
    return is_loopback(host)


@dataclass
class Dashboard:
    store: RunStore
    host: str
    port: int
    run_id: str | None
    interval: float
    token: str | None  # None: no token (loopback only, `--no-token`)

    def __post_init__(self) -> None:
        self.hub = Hub(self.store, self.interval, self.run_id)
        self.socket = _bind(self.host, self.port)
        self.port = self.socket.getsockname()[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        query = f"?token={self.token}" if self.token else ""
        return f"http://{host}:{self.port}/{query}"

    def serve(self) -> None:
        """Serve until SIGINT/SIGTERM (uvicorn handles both)."""
        config = uvicorn.Config(
            create_app(self.hub, self.token, self.port, allowed_hosts(self.host, self.port)),
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
            lifespan="off",
        )
        try:
            uvicorn.Server(config).run(sockets=[self.socket])
        finally:
            self.hub.close()
            self.socket.close()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise MissingTool(
            f"the dashboard cannot listen on {host}:{port}: {exc.strerror}",
            hint="choose another port with --port (0 picks a free one)",
        ) from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
