"""The controller's HTTP API (ASGI) and its command line, ``agentrl-controller``.

Endpoints (AgentRL wire protocol, prefix ``/api``; see :mod:`agentrl_ext.env.protocol`):
``start_sample``, ``interact``, ``cancel``, ``get_indices``, ``list_workers``, ``list_sessions``,
``calculate_overall``, ``receive_heartbeat``, ``cancel_notice``; plus ``GET /metrics``
(Prometheus) and ``GET /api/health``.
"""

from __future__ import annotations

import argparse
import logging
import time

import pydantic_core

from agentrl_ext.env.asgi import HttpError, JsonApp, Request, Response, json_response
from agentrl_ext.env.controller.config import ControllerConfig
from agentrl_ext.env.controller.metrics import CONTENT_TYPE_LATEST
from agentrl_ext.env.controller.service import ControllerService
from agentrl_ext.env.protocol import (
    SESSION_ID_HEADER,
    CalculateOverallRequest,
    HeartbeatRequest,
    InteractRequest,
    StartSampleRequest,
)
from agentrl_ext.env.serving import serve

logger = logging.getLogger(__name__)

API = "/api"
_SESSION_HEADER = SESSION_ID_HEADER.encode()


def session_id_of(request: Request) -> int:
    """The session id from the ``session_id`` header (or, for older clients, the JSON body)."""
    raw: object = request.header(_SESSION_HEADER)
    if raw is None and request.body:
        try:
            body = pydantic_core.from_json(request.body)
        except ValueError:
            body = None
        raw = body.get("session_id") if isinstance(body, dict) else None
    if raw is None:
        raise HttpError(
            400,
            f"{request.path} needs a 'session_id' header (start_sample returns it in its 'session_id' header)",
        )
    try:
        if isinstance(raw, bool):
            raise ValueError(raw)
        return int(raw)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise HttpError(400, f"session_id must be an integer, got {raw!r}") from None


class ControllerApp(JsonApp):
    """The controller's ASGI app; ``service`` holds its state (handy for embedding)."""

    def __init__(self, service: ControllerService) -> None:
        super().__init__("agentrl-controller")
        self.service = service
        self.on_startup.append(service.start)
        self.on_shutdown.append(service.stop)


def create_app(
    config: ControllerConfig | None = None, service: ControllerService | None = None
) -> ControllerApp:
    """Build the controller's ASGI app around a :class:`ControllerService`."""
    svc = service or ControllerService(config)
    app = ControllerApp(svc)

    def counted(endpoint: str, error: HttpError) -> HttpError:
        if 400 <= error.status < 500:
            svc.metrics.client_error(endpoint)
        return error

    async def start_sample(request: Request) -> Response:
        try:
            body = request.parse(StartSampleRequest, "start_sample")
            session_id, answer = await svc.start_sample(body)
        except HttpError as exc:
            raise counted("start_sample", exc) from None
        return json_response(answer, headers=[(_SESSION_HEADER, str(session_id).encode())])

    async def interact(request: Request) -> Response:
        try:
            session_id = session_id_of(request)
            answer = await svc.interact(session_id, request.parse(InteractRequest, "interact"))
        except HttpError as exc:
            raise counted("interact", exc) from None
        return json_response(answer)

    async def cancel(request: Request) -> Response:
        try:
            answer = await svc.cancel(session_id_of(request))
        except HttpError as exc:
            raise counted("cancel", exc) from None
        return json_response(answer)

    async def get_indices(request: Request) -> Response:
        name = request.query("name")
        if not name:
            raise counted("get_indices", HttpError(400, "get_indices needs ?name=<task name>"))
        return json_response(svc.get_indices(name))

    async def list_workers(request: Request) -> Response:
        return json_response(svc.list_workers())

    async def list_sessions(request: Request) -> Response:
        return json_response(svc.list_sessions(request.query("name")))

    async def calculate_overall(request: Request) -> Response:
        body = request.parse(CalculateOverallRequest, "calculate_overall")
        if not body.name:
            raise HttpError(422, "calculate_overall needs the task 'name' in its body")
        status, answer = await svc.calculate_overall(body.name, request.body)
        return Response(status, answer)

    async def receive_heartbeat(request: Request) -> Response:
        return json_response(
            await svc.receive_heartbeat(request.parse(HeartbeatRequest, "receive_heartbeat"))
        )

    async def cancel_notice(request: Request) -> Response:
        # agentrl-worker's cancel_with_notice reports finished cancellations here; our controller
        # waits for cancel itself, so the notice only needs an answer.
        return json_response({"status": "ok"})

    async def health(request: Request) -> Response:
        return json_response(
            {
                "status": "ok",
                "uptime_s": round(time.time() - svc.started_at, 3),
                "open_sessions": len(svc.sessions.open),
                "workers": len(svc.registry.by_address),
            }
        )

    async def metrics(request: Request) -> Response:
        return Response(200, svc.metrics.render(), [(b"content-type", CONTENT_TYPE_LATEST.encode())])

    for method, path, handler in (
        ("POST", "/start_sample", start_sample),
        ("POST", "/interact", interact),
        ("POST", "/cancel", cancel),
        ("GET", "/get_indices", get_indices),
        ("GET", "/list_workers", list_workers),
        ("GET", "/list_sessions", list_sessions),
        ("POST", "/calculate_overall", calculate_overall),
        ("POST", "/receive_heartbeat", receive_heartbeat),
        ("POST", "/cancel_notice", cancel_notice),
        ("GET", "/health", health),
    ):
        app.route(method, API + path, handler)
    app.route("GET", "/metrics", metrics)
    return app


def main(argv: list[str] | None = None) -> None:
    """``agentrl-controller --host 127.0.0.1 --port 5020``: run the centralized controller."""
    defaults = ControllerConfig()
    parser = argparse.ArgumentParser(
        prog="agentrl-controller", description="AgentRL-compatible environment controller"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5020, help="port to bind (default 5020)")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=defaults.idle_timeout_s,
        help="seconds before an idle session is cancelled",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=defaults.heartbeat_timeout_s,
        help="seconds without heartbeat before a worker is unhealthy",
    )
    parser.add_argument(
        "--check-interval",
        type=float,
        default=defaults.check_interval_s,
        help="seconds between health/expiry checks",
    )
    parser.add_argument(
        "--worker-timeout",
        type=float,
        default=defaults.worker_request_timeout_s,
        help="longest wait for a worker's answer, seconds",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = ControllerConfig(
            idle_timeout_s=args.idle_timeout,
            heartbeat_timeout_s=args.heartbeat_timeout,
            check_interval_s=args.check_interval,
            worker_request_timeout_s=args.worker_timeout,
        )
    except ValueError as exc:
        parser.error(str(exc))
    serve(create_app(config), args.host, args.port, args.log_level)
