"""The controller's HTTP API (ASGI) and its command line, ``agentrl-controller``.

Endpoints (AgentRL wire protocol, prefix ``/api``; see :mod:`agentrl_ext.env.protocol`):
``start_sample``, ``interact``, ``cancel``, ``get_indices``, ``list_workers``, ``list_sessions``,
``calculate_overall``, ``receive_heartbeat``, ``cancel_notice``; plus ``GET /metrics``
(Prometheus) and ``GET /api/health``.
"""

from __future__ import annotations

import logging
import time

import pydantic_core
from starlette.applications import Starlette
from starlette.middleware import Middleware

from agentrl_ext import cli
from agentrl_ext.env.auth import (
    CLIENT_SECRET_ENV,
    WORKER_SECRET_ENV,
    BearerAuth,
    ServiceSecrets,
    load_secret,
    require_secret_beyond_loopback,
)
from agentrl_ext.env.controller.config import ControllerConfig, add_config_options, config_from_options
from agentrl_ext.env.controller.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from agentrl_ext.env.controller.service import ControllerService
from agentrl_ext.env.protocol import (
    API_PREFIX,
    SESSION_ID_HEADER,
    CalculateOverallRequest,
    HeartbeatRequest,
    InteractRequest,
    StartSampleRequest,
)
from agentrl_ext.env.serving import serve
from agentrl_ext.env.web import (
    HttpError,
    Request,
    Response,
    json_app,
    json_response,
    parse_json,
    read_body,
)

logger = logging.getLogger(__name__)


def session_id_of(request: Request, body: bytes) -> int:
    """The session id from the ``session_id`` header (or, for older clients, the JSON body)."""
    raw: object = request.headers.get(SESSION_ID_HEADER)
    if raw is None and body:
        try:
            parsed = pydantic_core.from_json(body)
        except ValueError:
            parsed = None
        raw = parsed.get("session_id") if isinstance(parsed, dict) else None
    if raw is None:
        raise HttpError(
            400,
            f"{request.url.path} needs a 'session_id' header (start_sample returns it in its 'session_id' header)",
        )
    try:
        if isinstance(raw, bool):
            raise ValueError(raw)
        return int(raw)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise HttpError(400, f"session_id must be an integer, got {raw!r}") from None


START_BODY_LIMIT = 4 * 1024 * 1024
"""Largest ``start_sample`` body (a custom task's definition rides in it)."""
INTERACT_BODY_LIMIT = 4 * 1024 * 1024
"""Largest ``interact`` body: one agent step (a 32k-token answer is ~150 kB of JSON)."""
HEARTBEAT_BODY_LIMIT = 16 * 1024 * 1024
"""Largest heartbeat (it lists every sample index of the task)."""
OVERALL_BODY_LIMIT = 16 * 1024 * 1024
"""Largest ``calculate_overall`` body: the finished samples of an evaluation with their histories
(AgentRL's evaluator sends none; ours sends an empty list to read the task's card); the bound of
the heartbeat, the largest body a worker sends, not the 64 MiB of the reader's default."""
SMALL_BODY_LIMIT = 64 * 1024
"""Largest body of a call that carries no more than a session id."""

WORKER_PATHS = frozenset(API_PREFIX + path for path in ("/receive_heartbeat", "/cancel_notice"))
"""What task workers call; guarded by the worker secret."""
OPEN_PATHS = frozenset({API_PREFIX + "/health"})
"""Never guarded: liveness probes."""


def create_app(
    config: ControllerConfig | None = None,
    service: ControllerService | None = None,
    secrets: ServiceSecrets | None = None,
) -> Starlette:
    """Build the controller's ASGI app around a :class:`ControllerService` (``app.state.service``).

    ``secrets`` guard the worker endpoints (:data:`WORKER_PATHS`) and every other endpoint but
    :data:`OPEN_PATHS` (see :mod:`agentrl_ext.env.auth`); the worker secret is also sent to workers.
    """
    secrets = secrets or ServiceSecrets()
    svc = service or ControllerService(config, worker_secret=secrets.worker)

    async def body_of(request: Request, limit: int) -> bytes:
        return await read_body(request, limit, svc.config.body_idle_timeout_s, svc.config.body_timeout_s)

    def counted(endpoint: str, error: HttpError) -> HttpError:
        if 400 <= error.status < 500:
            svc.metrics.client_error(endpoint)
        return error

    async def start_sample(request: Request) -> Response:
        try:
            raw = await body_of(request, START_BODY_LIMIT)
            body = parse_json(raw, StartSampleRequest, "start_sample")
            session_id, answer = await svc.start_sample(body)
        except HttpError as exc:
            raise counted("start_sample", exc) from None
        return json_response(answer, headers={SESSION_ID_HEADER: str(session_id)})

    async def interact(request: Request) -> Response:
        try:
            if SESSION_ID_HEADER in request.headers:
                # An unknown session is answered before a byte of the body is read or parsed.
                session_id = session_id_of(request, b"")
                svc.check_known(session_id)
                body = await body_of(request, INTERACT_BODY_LIMIT)
            else:
                body = await body_of(request, INTERACT_BODY_LIMIT)
                session_id = session_id_of(request, body)
            answer = await svc.interact(session_id, parse_json(body, InteractRequest, "interact"))
        except HttpError as exc:
            raise counted("interact", exc) from None
        return json_response(answer)

    async def cancel(request: Request) -> Response:
        try:
            body = b"" if SESSION_ID_HEADER in request.headers else await body_of(request, SMALL_BODY_LIMIT)
            answer = await svc.cancel(session_id_of(request, body))
        except HttpError as exc:
            raise counted("cancel", exc) from None
        return json_response(answer)

    async def get_indices(request: Request) -> Response:
        name = request.query_params.get("name")
        try:
            if not name:
                raise HttpError(400, "get_indices needs ?name=<task name>")
            return json_response(svc.get_indices(name))
        except HttpError as exc:
            raise counted("get_indices", exc) from None

    async def list_workers(request: Request) -> Response:
        return json_response(svc.list_workers())

    async def list_sessions(request: Request) -> Response:
        return json_response(svc.list_sessions(request.query_params.get("name")))

    async def calculate_overall(request: Request) -> Response:
        try:
            raw = await body_of(request, OVERALL_BODY_LIMIT)
            body = parse_json(raw, CalculateOverallRequest, "calculate_overall")
            if not body.name:
                raise HttpError(422, "calculate_overall needs the task 'name' in its body")
        except HttpError as exc:
            raise counted("calculate_overall", exc) from None
        status, answer = await svc.calculate_overall(body.name, raw)
        return Response(answer, status, media_type="application/json")

    async def receive_heartbeat(request: Request) -> Response:
        beat = parse_json(await body_of(request, HEARTBEAT_BODY_LIMIT), HeartbeatRequest, "receive_heartbeat")
        return json_response(await svc.receive_heartbeat(beat))

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
        return Response(svc.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    routes = [  # matched in this order: the calls of every session first
        ("POST", "/interact", interact),
        ("POST", "/start_sample", start_sample),
        ("POST", "/cancel", cancel),
        ("GET", "/get_indices", get_indices),
        ("GET", "/list_workers", list_workers),
        ("GET", "/list_sessions", list_sessions),
        ("POST", "/calculate_overall", calculate_overall),
        ("POST", "/receive_heartbeat", receive_heartbeat),
        ("POST", "/cancel_notice", cancel_notice),
        ("GET", "/health", health),
    ]
    app = json_app(
        "agentrl-controller",
        [(method, API_PREFIX + path, handler) for method, path, handler in routes]
        + [("GET", "/metrics", metrics)],
        on_startup=[svc.start],
        on_shutdown=[svc.stop],
        middleware=[
            Middleware(
                BearerAuth,
                rules=[(WORKER_PATHS, secrets.worker, "task workers"), (None, secrets.client, "clients")],
                open_paths=OPEN_PATHS,
            )
        ]
        if secrets.worker or secrets.client
        else [],  # no secret: not a layer to pass for every forwarded step
    )
    app.state.service = svc
    return app


def main(argv: list[str] | None = None) -> None:
    """``agentrl-controller --host 127.0.0.1 --port 5020``: run the centralized controller."""
    parser = cli.parser("agentrl-controller", "AgentRL-compatible environment controller.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=int, default=cli.DEFAULT_CONTROLLER_PORT, help="port to bind")
    add_config_options(parser)
    parser.add_argument(
        "--worker-secret-file",
        default=None,
        help=f"file holding the secret task workers must send (default: ${WORKER_SECRET_ENV}); "
        "required when --host is not a loopback address",
    )
    parser.add_argument(
        "--client-secret-file",
        default=None,
        help=f"file holding the secret clients must send (default: ${CLIENT_SECRET_ENV}; none: open)",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = config_from_options(args)
        secrets = ServiceSecrets(
            worker=load_secret(args.worker_secret_file, WORKER_SECRET_ENV),
            client=load_secret(args.client_secret_file, CLIENT_SECRET_ENV),
        )
        require_secret_beyond_loopback(
            args.host, secrets.worker, "agentrl-controller", "--worker-secret-file", WORKER_SECRET_ENV
        )
    except ValueError as exc:
        parser.error(str(exc))
    serve(create_app(config, secrets=secrets), args.host, args.port, args.log_level, config.head_timeout_s)
