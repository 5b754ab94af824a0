"""Controller settings (one dataclass, validated when built) and the ``agentrl-controller``
options that set them (one table, :data:`CONFIG_OPTIONS`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields


@dataclass
class ControllerConfig:
    """Timeouts and limits of the centralized controller.

    Defaults follow AgentRL: workers send a heartbeat every 8 s, so a worker silent for
    ``heartbeat_timeout_s`` (about three missed beats) is lost; idle sessions expire after
    ``idle_timeout_s`` (600 s).

    How long a client may wait: a call forwarded to a worker ends after at most
    ``worker_request_timeout_s`` (the session then ends with ``task error`` and the reason), and
    at once when the worker is declared lost, which happens within ``heartbeat_timeout_s +
    check_interval_s`` of its last heartbeat. A client's own timeout should exceed both (see
    :data:`agentrl_ext.env.client.DEFAULT_TIMEOUT_S`), so that the controller's answer, with its
    reason, arrives first.
    """

    heartbeat_timeout_s: float = 25.0
    """A worker whose last heartbeat is older than this is lost: its sessions and the calls in
    flight to it end with ``task error``."""
    idle_timeout_s: float = 600.0
    """An open session with no request for this long is cancelled on its worker."""
    check_interval_s: float = 1.0
    """How often worker health and session expiry are checked."""
    worker_request_timeout_s: float = 120.0
    """Longest wait for a live worker's answer to one call (an environment step may run a long
    command: AgentRL's OS task allows 30 s per command); then the session ends with ``task error``."""
    worker_connect_timeout_s: float = 5.0
    """Longest wait to open a TCP connection to a worker (then it counts as lost). A call waiting
    for one of the worker's pooled connections to be free is bounded by ``worker_request_timeout_s``."""
    full_backoff_s: float = 1.0
    """After a worker answers 406 (full), route around it this long or until one of its sessions ends."""
    forget_worker_after_s: float = 600.0
    """An unhealthy worker is dropped from ``list_workers`` after this long without a heartbeat."""
    ended_session_ttl_s: float = 600.0
    """How long an ended session's final status is kept to answer late calls about it."""
    max_unreported_sessions: int = 100_000
    """Upper bound on remembered sessions the controller ended and the client has not heard of."""
    max_reported_sessions: int = 20_000
    """Upper bound on remembered finished sessions whose status the client already saw."""
    max_connections_per_worker: int = 2048
    """Pooled keep-alive connections to one worker (one per request in flight)."""
    keepalive_timeout_s: float = 4.0
    """Idle pooled connections are closed after this long; below uvicorn's default 5 s so a worker
    never closes a connection the controller is about to reuse."""
    cancel_grace_s: float = 30.0
    """Longest wait for a worker to confirm a cancel before the controller gives up on it."""
    rejoin_grace_s: float = 10.0
    """For this long after start-up, a task without workers is answered 503 with ``Retry-After``
    (not 404): after a controller restart its workers re-register with their next heartbeat
    (every 8 s). 0 turns it off."""

    body_idle_timeout_s: float = 30.0
    """A request body that sends no byte for this long is answered 408 and its connection closed."""
    body_timeout_s: float = 120.0
    """Longest time one request body may take in all (then 408)."""
    head_timeout_s: float = 30.0
    """A request head (or a new connection's first request) not complete after this long: 408, closed."""

    shard: int = 0
    """This controller's number among ``shards`` controller processes serving one worker fleet:
    its session ids are ``shard`` modulo ``shards``, so a client (or a proxy) routes a session's
    calls to ``controllers[session_id % shards]`` without any shared session table."""
    shards: int = 1
    """How many controller processes serve the fleet (each worker heartbeats to all of them)."""

    def __post_init__(self) -> None:
        if not (
            isinstance(self.shard, int) and isinstance(self.shards, int) and 0 <= self.shard < self.shards
        ):
            raise ValueError(
                f"ControllerConfig.shard={self.shard!r} must be an integer in [0, shards={self.shards!r}); "
                "number the controllers of one fleet 0..shards-1"
            )
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name in ("shard", "shards"):
                continue
            if item.name == "rejoin_grace_s" and isinstance(value, (int, float)) and value == 0:
                continue
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(
                    f"ControllerConfig.{item.name} must be a positive number, got {value!r}; "
                    f"the default is {item.default!r}"
                )
        if self.check_interval_s > min(self.heartbeat_timeout_s, self.idle_timeout_s):
            raise ValueError(
                f"ControllerConfig.check_interval_s={self.check_interval_s} must not exceed "
                f"heartbeat_timeout_s={self.heartbeat_timeout_s} or idle_timeout_s={self.idle_timeout_s}; "
                "otherwise expiry and health checks run too late"
            )


@dataclass(frozen=True)
class ConfigOption:
    """One ``agentrl-controller`` option: its flag, the :class:`ControllerConfig` field it sets
    (type and default from the field), and its help."""

    flag: str
    field: str
    help: str


CONFIG_OPTIONS = (
    ConfigOption("--idle-timeout", "idle_timeout_s", "seconds before an idle session is cancelled"),
    ConfigOption(
        "--heartbeat-timeout", "heartbeat_timeout_s", "seconds without heartbeat before a worker is unhealthy"
    ),
    ConfigOption("--check-interval", "check_interval_s", "seconds between health/expiry checks"),
    ConfigOption(
        "--worker-timeout", "worker_request_timeout_s", "longest wait for a worker's answer, seconds"
    ),
    ConfigOption(
        "--rejoin-grace",
        "rejoin_grace_s",
        "seconds after start during which a task without workers gets 503 + Retry-After, not 404",
    ),
    ConfigOption(
        "--body-idle-timeout",
        "body_idle_timeout_s",
        "seconds a request body may send nothing before it is answered 408",
    ),
    ConfigOption(
        "--head-timeout",
        "head_timeout_s",
        "seconds a request head (or a silent new connection) may take before it is answered 408",
    ),
    ConfigOption(
        "--shard", "shard", "this controller's number (0..shards-1) among several serving one worker fleet"
    ),
    ConfigOption(
        "--shards",
        "shards",
        "how many controller processes serve the fleet; session ids are shard modulo shards",
    ),
)
"""The settings ``agentrl-controller`` takes on its command line (the others keep their defaults);
:func:`agentrl_ext.env.launcher.controller_argv` spells them as keywords (``idle_timeout=...``)."""


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """Add :data:`CONFIG_OPTIONS` to ``parser``, each with its field's type and default."""
    defaults = ControllerConfig()
    for option in CONFIG_OPTIONS:
        default = getattr(defaults, option.field)
        parser.add_argument(
            option.flag,
            dest=option.field,
            metavar=option.flag.removeprefix("--").replace("-", "_").upper(),
            type=type(default),
            default=default,
            help=option.help,
        )


def config_from_options(args: argparse.Namespace) -> ControllerConfig:
    """The :class:`ControllerConfig` of parsed :data:`CONFIG_OPTIONS` (ValueError naming a bad value)."""
    return ControllerConfig(**{option.field: getattr(args, option.field) for option in CONFIG_OPTIONS})
