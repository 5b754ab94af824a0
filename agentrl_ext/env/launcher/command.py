"""``agentrl-envs``: ``up`` starts the stack and holds it until Ctrl-C / SIGTERM; ``list`` prints
the task catalogue; ``front`` serves a secret-adding front for AgentRL's own worker and evaluator
(:mod:`agentrl_ext.env.front`)."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from agentrl_ext import cli
from agentrl_ext.env.auth import CLIENT_SECRET_ENV, WORKER_SECRET_ENV, ServiceSecrets, load_secret
from agentrl_ext.env.front import FRONT_TIMEOUT_S, check_front, create_front_app
from agentrl_ext.env.launcher.processes import DEFAULT_FRONT_PORT, DEFAULT_PORT, LOOPBACK
from agentrl_ext.env.launcher.stack import READY_LINE, EnvStack
from agentrl_ext.env.serving import serve
from agentrl_ext.env.tasks import SPLITS, task_specs

logger = logging.getLogger(__name__)


class _Shutdown(BaseException):
    """Raised in the main thread by SIGINT / SIGTERM."""


def _parse_kwargs(values: list[str]) -> dict[str, dict[str, Any]]:
    parsed: dict[str, dict[str, Any]] = {}
    for value in values:
        name, _, text = value.partition("=")
        try:
            kwargs = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--task-kwargs {value!r}: not TASK=JSON ({exc})") from None
        if not isinstance(kwargs, dict):
            raise ValueError(f"--task-kwargs {value!r}: the JSON must be an object")
        parsed.setdefault(name, {}).update(kwargs)
    return parsed


def _parse_replicas(text: str, option: str = "--replicas") -> dict[str, int]:
    """``alfworld=7,webshop=2`` -> ``{"alfworld": 7, "webshop": 2}``."""
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, count = item.partition("=")
        if not count.strip().isdigit():
            raise ValueError(f"{option} {text!r}: {item!r} is not TASK=N (N a whole number >= 1)")
        out[name.strip()] = int(count)
    return out


def _parse_controller_options(values: list[str]) -> dict[str, float]:
    """``heartbeat_timeout=10`` -> ``{"heartbeat_timeout": 10.0}`` (agentrl-controller's options)."""
    from agentrl_ext.env.controller.config import CONFIG_OPTIONS

    known = {option.flag.removeprefix("--").replace("-", "_") for option in CONFIG_OPTIONS} - {
        "shard",
        "shards",
    }
    out: dict[str, float] = {}
    for value in values:
        key, _, number = value.partition("=")
        key = key.strip().removeprefix("--").replace("-", "_")
        if key not in known:
            raise ValueError(f"--controller-option {value!r}: {key!r} is none of {sorted(known)}")
        try:
            out[key] = float(number)
        except ValueError:
            raise ValueError(f"--controller-option {value!r}: not NAME=SECONDS") from None
    return out


def _add_ray_options(up: Any) -> None:
    from agentrl_ext.env.launcher.ray_fleet import ENV_RESOURCE, PLACEMENTS

    up.add_argument(
        "--placement",
        default="local",
        choices=PLACEMENTS,
        help="local: processes (or containers) on this host; ray: Ray actors on the cluster's nodes that "
        "offer the --ray-resource (docs/environment_service.md#the-fleet-on-ray)",
    )
    up.add_argument(
        "--ray-address", default="auto", help="placement ray: the cluster (auto: $RAY_ADDRESS or this node's)"
    )
    up.add_argument(
        "--ray-resource",
        default=ENV_RESOURCE,
        help="placement ray: the custom resource a node offers per task worker",
    )
    up.add_argument(
        "--per-node",
        default="",
        metavar="TASK=N[,TASK=N...]",
        help="placement ray: workers per task on every node offering the resource, also nodes that join "
        "(instead of one --replicas worker, unless --replicas names the task too)",
    )
    up.add_argument(
        "--shards", type=int, default=1, help="placement ray: controller processes (shard k on --port + k)"
    )
    up.add_argument(
        "--controller-option",
        action="append",
        default=[],
        metavar="NAME=SECONDS",
        help="an agentrl-controller option, e.g. heartbeat_timeout=10",
    )
    up.add_argument(
        "--heartbeat-interval", type=float, default=None, help="the workers' heartbeat interval (default 8 s)"
    )


def _add_front_command(commands: Any) -> None:
    front = commands.add_parser(
        "front",
        help="a loopback front that adds the service's secrets for agentrl-worker / agentrl-eval",
        description="Forward every request to the controller with the secret it needs added: the "
        "worker secret on what workers call, the client secret on the rest. Point AgentRL's "
        "agentrl-worker (--controller) and agentrl-eval at http://127.0.0.1:PORT/api. Loopback only: "
        "whoever reaches it acts with its secrets.",
        formatter_class=cli.HelpFormatter,
    )
    front.add_argument(
        "--controller-url", required=True, help="the controller's API base, http://HOST:PORT/api"
    )
    front.add_argument("--host", default=LOOPBACK, help="the loopback address to bind")
    front.add_argument("--port", type=int, default=DEFAULT_FRONT_PORT, help="the port to bind")
    front.add_argument(
        "--worker-secret-file",
        default=None,
        help=f"the worker secret, added for agentrl-worker (default: ${WORKER_SECRET_ENV})",
    )
    front.add_argument(
        "--client-secret-file",
        default=None,
        help=f"the client secret, added for agentrl-eval (default: ${CLIENT_SECRET_ENV})",
    )
    front.add_argument(
        "--timeout",
        type=float,
        default=FRONT_TIMEOUT_S,
        help="longest wait for the controller's answer, seconds",
    )
    front.add_argument("--log-level", default="info", help="debug, info, warning, error")


def _serve_front(parser: Any, args: Any) -> int:
    try:
        secrets = ServiceSecrets(
            worker=load_secret(args.worker_secret_file, WORKER_SECRET_ENV),
            client=load_secret(args.client_secret_file, CLIENT_SECRET_ENV),
        )
        check_front(args.host, args.controller_url, secrets)
    except ValueError as exc:
        parser.error(str(exc))
    logger.info("front on %s:%s -> %s (%r)", args.host, args.port, args.controller_url, secrets)
    serve(create_front_app(args.controller_url, secrets, args.timeout), args.host, args.port, args.log_level)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``agentrl-envs up|list|front``."""
    defaults = cli.HelpFormatter
    parser = cli.parser("agentrl-envs", __doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the known tasks", formatter_class=defaults)
    up = commands.add_parser(
        "up", help="start the controller and task workers; Ctrl-C stops them", formatter_class=defaults
    )
    cli.add_tasks(up, help=f"comma-separated, of: {','.join(task_specs())}")
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help="the controller's port")
    up.add_argument(
        "--host",
        default=LOOPBACK,
        help="the address the controller and the workers bind; beyond loopback --secret-file (or "
        "$AGENTRL_ENV_WORKER_SECRET) is required",
    )
    up.add_argument(
        "--advertise-host",
        default=None,
        help="the address the trainer's nodes and the workers reach the controller at (default: --host; "
        "required with --host 0.0.0.0)",
    )
    up.add_argument(
        "--secret-file", default=None, help="the worker secret, given to the controller and the workers"
    )
    up.add_argument(
        "--replicas",
        default="",
        metavar="TASK=N[,TASK=N...]",
        help="workers per task (default 1 each), e.g. alfworld=7,webshop=2",
    )
    up.add_argument("--docker", action="store_true", help="each worker in its own container")
    up.add_argument(
        "--split",
        default="train",
        choices=SPLITS,
        help="the tasks' split: train for training data, test (held out) for evaluation",
    )
    up.add_argument(
        "--task-kwargs",
        action="append",
        default=[],
        metavar="TASK=JSON",
        help='e.g. dbbench=\'{"backend": "sqlite"}\'',
    )
    up.add_argument("--log-dir", type=Path, default=None, help="process logs (none: a temporary folder)")
    up.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for each worker")
    up.add_argument(
        "--front-port",
        type=int,
        default=None,
        help="also serve a secret-adding front on 127.0.0.1:PORT for agentrl-worker / agentrl-eval "
        "(see agentrl-envs front --help); it holds --secret-file and $AGENTRL_ENV_CLIENT_SECRET",
    )
    _add_ray_options(up)
    _add_front_command(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health poll
    if args.command == "list":
        for name, row in task_specs().items():
            print(
                f"{name:<10} {row.task_class}  needs: {','.join(row.needs) or '-'}  splits: {row.splits or '-'}"
                f"  expert: {row.expert or '-'}"
            )
        return 0
    if args.command == "front":
        return _serve_front(parser, args)
    try:
        stack = EnvStack(
            tasks=cli.tasks_of(args.tasks),
            port=args.port,
            docker=args.docker,
            split=args.split,
            kwargs=_parse_kwargs(args.task_kwargs),
            log_dir=args.log_dir,
            ready_timeout_s=args.ready_timeout,
            die_with_parent=threading.current_thread() is threading.main_thread(),
            host=args.host,
            advertise_host=args.advertise_host,
            secret_file=args.secret_file,
            replicas=_parse_replicas(args.replicas),
            front_port=args.front_port,
            placement=args.placement,
            ray_address=args.ray_address,
            ray_resource=args.ray_resource,
            per_node=_parse_replicas(args.per_node, "--per-node"),
            shards=args.shards,
            controller_options=_parse_controller_options(args.controller_option),
            heartbeat_interval=args.heartbeat_interval,
        )
    except ValueError as exc:
        parser.error(str(exc))

    def shutdown(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not break the clean-up
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Shutdown(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGTERM, shutdown)
    code = 0
    try:
        with stack:
            print(stack.describe(), flush=True)
            if stack.split != "train":
                print(
                    f"agentrl-envs: serving the held-out {stack.split} split, for evaluation; "
                    "agentrl-build-dataset refuses to build a training set from it (--allow-held-out overrides)",
                    flush=True,
                )
            print(f"{READY_LINE} ({', '.join(stack.tasks)}); Ctrl-C stops everything", flush=True)
            while not (dead := stack.dead()):
                time.sleep(0.5)
            logger.error(
                "stopped on its own: %s; stopping the rest (logs in %s)", ", ".join(dead), stack.log_dir
            )
            code = 1
    except _Shutdown as reason:
        logger.info("%s: stopped everything", reason)
    except (RuntimeError, TimeoutError) as exc:
        logger.error("%s", exc)
        code = 1
    return code
