"""Shared secrets of the environment service: who may register workers, who may start episodes.

Two secrets, each optional on loopback and each a plain bearer token (``Authorization: Bearer
<secret>``), compared in constant time:

- the **worker secret** guards what workers call on the controller (``receive_heartbeat``,
  ``cancel_notice``); the controller sends it to workers on every call it forwards, and our
  :class:`~agentrl_ext.env.worker.TaskWorker` refuses calls without it. It is required whenever
  the controller (or a worker) binds an address beyond loopback.
- the **client secret** guards what trainers and evaluators call (``start_sample``, ``interact``,
  ``list_sessions``, ``/metrics``, ...); ``/api/health`` stays open for probes.

Each comes from a file (``--worker-secret-file``, ``--client-secret-file``) or, without one, from
an environment variable (:data:`WORKER_SECRET_ENV`, :data:`CLIENT_SECRET_ENV`). With neither set on
loopback everything works as before, so AgentRL's ``agentrl-worker`` 0.4.0 and ``agentrl-eval``
0.1.2 (which send no ``Authorization`` header) keep working there.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic_core

WORKER_SECRET_ENV = "AGENTRL_ENV_WORKER_SECRET"
"""Environment variable holding the worker secret (when no ``--worker-secret-file`` is given)."""
CLIENT_SECRET_ENV = "AGENTRL_ENV_CLIENT_SECRET"
"""Environment variable holding the client secret (when no ``--client-secret-file`` is given)."""
MIN_SECRET_CHARS = 16
HOW_TO_MAKE_ONE = "python -c 'import secrets; print(secrets.token_urlsafe(32))' > secret.txt"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def load_secret(path: str | os.PathLike[str] | None, env_var: str) -> str | None:
    """The secret in file ``path`` (surrounding whitespace stripped), else ``$env_var``, else None.

    Raises ValueError naming the source when the file cannot be read or the secret is shorter
    than :data:`MIN_SECRET_CHARS`.
    """
    if path is not None:
        try:
            secret, source = Path(path).read_text().strip(), f"secret file {os.fspath(path)!r}"
        except OSError as exc:
            raise ValueError(f"cannot read the secret file {os.fspath(path)!r}: {exc}") from None
    else:
        raw = os.environ.get(env_var)
        if raw is None:
            return None
        secret, source = raw.strip(), f"${env_var}"
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(
            f"the {source} holds {len(secret)} characters; a secret needs at least {MIN_SECRET_CHARS} "
            f"(make one with: {HOW_TO_MAKE_ONE})"
        )
    return secret


def bearer(secret: str | None) -> dict[str, str]:
    """The ``Authorization`` header carrying ``secret`` (none for None)."""
    return {"authorization": f"Bearer {secret}"} if secret else {}


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def require_secret_beyond_loopback(
    host: str, secret: str | None, program: str, option: str, env_var: str
) -> None:
    """Refuse (ValueError naming the fix) to serve ``host`` beyond loopback without a secret."""
    if secret is None and not is_loopback(host):
        raise ValueError(
            f"{program} refuses to bind {host!r} without a worker secret: anyone who can reach it could "
            f"register workers or call them. Give {option} PATH or set ${env_var} (at least "
            f"{MIN_SECRET_CHARS} characters; make one with: {HOW_TO_MAKE_ONE}), and start the workers "
            "with the same secret; or bind 127.0.0.1"
        )


@dataclass(frozen=True)
class ServiceSecrets:
    """The secrets a server checks; None leaves that group of endpoints open."""

    worker: str | None = None
    client: str | None = None

    def __repr__(self) -> str:  # never print a secret
        return f"ServiceSecrets(worker={'set' if self.worker else None}, client={'set' if self.client else None})"


@dataclass(frozen=True)
class _Rule:
    paths: frozenset[str] | None  # None: every path not matched by an earlier rule
    token: bytes
    who: str


class BearerAuth:
    """ASGI middleware: a request on a guarded path needs ``Authorization: Bearer <secret>``.

    Args:
        app: the wrapped app.
        rules: ``(paths, secret, who)``; ``paths`` None guards every path no earlier rule
            named; ``who`` names the callers in the 401 answer (``"workers"``).
        open_paths: never guarded (health probes).
    """

    def __init__(
        self,
        app: ASGIApp,
        rules: Sequence[tuple[frozenset[str] | None, str | None, str]],
        open_paths: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self._open = open_paths
        self._named = frozenset().union(*(paths for paths, _, _ in rules if paths is not None))
        self._rules = [
            _Rule(paths, f"Bearer {secret}".encode(), who) for paths, secret, who in rules if secret
        ]

    def _rule_for(self, path: str) -> _Rule | None:
        if path in self._open:
            return None
        for rule in self._rules:
            if rule.paths is None and path not in self._named:
                return rule
            if rule.paths is not None and path in rule.paths:
                return rule
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            rule = self._rule_for(scope["path"])
            if rule is not None:
                given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
                if not hmac.compare_digest(given, rule.token):
                    await _unauthorized(send, scope["path"], rule.who, bool(given))
                    return
        await self.app(scope, receive, send)


async def _unauthorized(send: Send, path: str, who: str, had_header: bool) -> None:
    problem = "a wrong secret" if had_header else "no 'Authorization: Bearer <secret>' header"
    detail = f"{path} is only for {who}: the request carried {problem}; send the shared secret of the {who}"
    body = pydantic_core.to_json({"detail": detail})
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b"Bearer"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
