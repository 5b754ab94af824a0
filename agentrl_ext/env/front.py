"""A secret-adding front for clients that cannot send the environment service's secrets.

AgentRL's published task-worker library (``agentrl-worker`` 0.4.0) and evaluation client
(``agentrl-eval`` 0.1.2) send no ``Authorization`` header, so they cannot reach a controller that
has a worker or client secret (:mod:`agentrl_ext.env.auth`). The front is a small reverse proxy
on the same host as them: it listens on loopback only, forwards every request to the controller
as it came (method, path, query, body, headers such as ``session_id``) and adds the one header
they lack: ``Authorization: Bearer <worker secret>`` on what workers call (``receive_heartbeat``,
``cancel_notice``), the client secret on everything else (``/api/health`` gets none). The
controller's answer comes back unchanged (status, body, ``session_id``, ``Retry-After``).

    agentrl-envs front --controller-url http://CONTROLLER:5020/api --port 5030 \\
        --worker-secret-file worker.secret --client-secret-file client.secret
    python -m agentrl.worker add --config tasks.yaml --controller http://127.0.0.1:5030/api ...
    # agentrl-eval: its controller address is http://127.0.0.1:5030/api

Why loopback only: whoever reaches the front acts with its secrets. Run one front per host where
such a worker or evaluator runs; hold only the secret that host needs (a front without a client
secret forwards client calls without one, and the controller refuses them).

What the front does not do: check the calls the controller sends to an ``agentrl-worker`` (that
library checks no secret; see docs/environment_service.md for where it may listen), route over
several controller shards (point it at one shard), or stream (bodies are read whole, up to
:data:`FRONT_BODY_LIMIT`, the largest body the controller itself takes).
"""

from __future__ import annotations

import logging

import httpx
from starlette.applications import Starlette

from agentrl_ext.env.auth import ServiceSecrets, bearer, is_loopback
from agentrl_ext.env.controller.app import HEARTBEAT_BODY_LIMIT, OPEN_PATHS, WORKER_PATHS
from agentrl_ext.env.protocol import API_PREFIX
from agentrl_ext.env.web import HttpError, Request, Response, json_app, read_body

logger = logging.getLogger(__name__)

FRONT_BODY_LIMIT = HEARTBEAT_BODY_LIMIT
"""Largest request body forwarded (the controller's own largest; it applies its per-endpoint limits)."""
FRONT_TIMEOUT_S = 600.0
"""Longest wait for the controller's answer to one forwarded call: above every bound the
controller puts on its own answers, so its answer, with its reason, comes first."""
CONNECT_TIMEOUT_S = 5.0

# Headers that describe one hop (or that the front sets itself), never forwarded either way.
_HOP_HEADERS = frozenset(
    {
        "authorization",
        "connection",
        "content-encoding",
        "content-length",
        "host",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def front_secret(path: str, secrets: ServiceSecrets) -> str | None:
    """The secret the controller wants on ``path``: the worker secret on the worker paths, none on
    the open ones, the client secret on the rest (the rules of the controller's ``BearerAuth``)."""
    if path in OPEN_PATHS:
        return None
    return secrets.worker if path in WORKER_PATHS else secrets.client


def check_front(host: str, controller_api: str, secrets: ServiceSecrets) -> None:
    """Refuse (ValueError naming the fix) a front beyond loopback, without a secret, or with a
    controller URL that is not an API base (``http://HOST:PORT/api``)."""
    if not is_loopback(host):
        raise ValueError(
            f"the front refuses to bind {host!r}: it adds the service's secrets to every request it "
            "forwards, so whoever reaches it acts with them. Bind 127.0.0.1 (or ::1) and run one front "
            "on each host where agentrl-worker or agentrl-eval runs"
        )
    if not (secrets.worker or secrets.client):
        raise ValueError(
            "the front holds no secret, so it would add nothing: give --worker-secret-file (for "
            "agentrl-worker) and/or --client-secret-file (for agentrl-eval), or set "
            "$AGENTRL_ENV_WORKER_SECRET / $AGENTRL_ENV_CLIENT_SECRET"
        )
    if not controller_api.rstrip("/").endswith(API_PREFIX) or "://" not in controller_api:
        raise ValueError(
            f"--controller-url {controller_api!r} is not the controller's API base; "
            f"expected http://HOST:PORT{API_PREFIX}"
        )


def create_front_app(
    controller_api: str,
    secrets: ServiceSecrets,
    timeout_s: float = FRONT_TIMEOUT_S,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> Starlette:
    """The front's ASGI app: every ``GET``/``POST`` forwarded to the controller at
    ``controller_api`` with the secret :func:`front_secret` picks for its path.

    A controller that cannot be reached is answered 502 naming it.
    """
    root = controller_api.rstrip("/").removesuffix(API_PREFIX)
    state: dict[str, httpx.AsyncClient] = {}

    async def open_client() -> None:
        state["client"] = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            # keep-alive connections below the controller's idle timeout (75 s)
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=30.0),
            trust_env=False,  # never through a proxy of the environment: the controller is named
        )

    async def close_client() -> None:
        if "client" in state:
            await state.pop("client").aclose()

    async def forward(request: Request) -> Response:
        path = request.url.path
        body = await read_body(request, FRONT_BODY_LIMIT) if request.method == "POST" else b""
        headers = {k: v for k, v in request.headers.items() if k not in _HOP_HEADERS}
        headers.update(bearer(front_secret(path, secrets)))
        query = request.url.query
        url = root + path + (f"?{query}" if query else "")
        try:
            answer = await state["client"].request(request.method, url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            logger.warning("%s %s: the controller at %s did not answer: %r", request.method, path, root, exc)
            raise HttpError(502, f"the front could not reach the controller at {root}: {exc!r}") from None
        kept = {k: v for k, v in answer.headers.items() if k not in _HOP_HEADERS}
        return Response(answer.content, answer.status_code, kept)

    routes = [(method, "/{path:path}", forward) for method in ("GET", "POST")]
    return json_app("agentrl-envs front", routes, on_startup=[open_client], on_shutdown=[close_client])
