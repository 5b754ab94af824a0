"""``agentrl-task-worker``: serve a :class:`Task` class given as ``module:ClassName``."""

from __future__ import annotations

import importlib
import json
import logging
from typing import Any

from agentrl_ext import cli
from agentrl_ext.env.auth import WORKER_SECRET_ENV, load_secret, require_secret_beyond_loopback
from agentrl_ext.env.protocol import HEARTBEAT_INTERVAL_S
from agentrl_ext.env.serving import serve
from agentrl_ext.env.worker.server import TaskWorker
from agentrl_ext.env.worker.task import Task


def load_task(spec: str, kwargs: dict[str, Any]) -> Task:
    """Import ``module:ClassName`` and build the task with ``kwargs``."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(
            f"task {spec!r} must be given as 'module.path:ClassName', e.g. 'envs.echo.task:EchoTask'"
        )
    module = importlib.import_module(module_name)
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ValueError(f"{spec!r} does not name a Task subclass (found {cls!r} in module {module_name!r})")
    return cls(**kwargs)


def main(argv: list[str] | None = None) -> None:
    """Run one task worker; it registers with the controller by heartbeat."""
    parser = cli.parser("agentrl-task-worker", "Serve an agentrl_ext Task over HTTP.")
    parser.add_argument("task", help="the Task class, as module.path:ClassName")
    parser.add_argument(
        "--task-kwargs", default="{}", help="JSON object of keyword arguments for the task class"
    )
    parser.add_argument(
        "--controller-url",
        "--controller",
        dest="controller_url",
        action="append",
        default=None,
        help="the controller's API base, e.g. http://127.0.0.1:5020/api (none: stand-alone); repeat it "
        "for the controller shards of one fleet (heartbeats go to each)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=int, default=5021, help="port to bind")
    parser.add_argument(
        "--self-address",
        default=None,
        help="URL the controller reaches this worker at (none: http://HOST:PORT/api)",
    )
    parser.add_argument("--concurrency", type=int, default=None, help="session limit (none: the task's)")
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=HEARTBEAT_INTERVAL_S,
        help="seconds between heartbeats",
    )
    parser.add_argument(
        "--secret-file",
        default=None,
        help=f"file holding the worker secret shared with the controller (default: ${WORKER_SECRET_ENV}); "
        "required when --host is not a loopback address",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        kwargs = json.loads(args.task_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError(f"--task-kwargs must be a JSON object, got {args.task_kwargs!r}")
        task = load_task(args.task, kwargs)
        secret = load_secret(args.secret_file, WORKER_SECRET_ENV)
        require_secret_beyond_loopback(
            args.host, secret, "agentrl-task-worker", "--secret-file", WORKER_SECRET_ENV
        )
    except (ValueError, ImportError) as exc:
        parser.error(str(exc))
    self_address = args.self_address
    if self_address is None:
        if args.host in ("0.0.0.0", "::"):
            parser.error(
                f"--host {args.host} binds every address; give --self-address so the controller can reach the worker"
            )
        self_address = f"http://{args.host}:{args.port}/api"
    worker = TaskWorker(
        task,
        controller_address=args.controller_url,
        self_address=self_address,
        concurrency=args.concurrency,
        heartbeat_interval_s=args.heartbeat_interval,
        split=kwargs["split"] if isinstance(kwargs.get("split"), str) else None,
        secret=secret,
    )
    serve(worker.app, args.host, args.port, args.log_level)
