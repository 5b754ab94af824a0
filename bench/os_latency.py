"""os benchmark: latency and memory per session through controller -> worker, on a Docker engine.

Everything runs on 127.0.0.1 and the engine of ``$DOCKER_HOST`` (else ``scripts/dockerd.sh``'s).
The client (this process) speaks the raw AgentRL protocol and plays the example solution of
every ``test`` problem (or the first ``--samples``): ``bash_action`` with the example, then
``answer_action`` with what it printed (the label for match problems). Measured:

- ``start_sample`` latency (container start, init scripts, start script, opening turn);
- per-step latency of ``bash_action`` and of the final answer (which runs the check scripts);
- gold accuracy (reward 1 expected; the README lists the known exceptions);
- memory per open session: the containers' own memory (cgroup ``memory.usage_in_bytes``) and the
  worker's RSS growth with ``--open`` sessions held;
- image build time: ``scripts/build_os_image.sh`` with ``--build`` (removes the image first).

Usage (a few minutes)::

    .venv/bin/python bench/os_latency.py [--samples 40] [--build]   # writes bench/results/os_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker

from agentrl_ext.data.store import install_from
from agentrl_ext.testing.env_servers import REPO, EnvServers
from agentrl_ext.testing.vendored_data import vendored_data_dir

sys.path.insert(0, str(REPO / "tests" / "envs" / "os"))
from latency_stats import percentiles, rss_mb
from os_helpers import OS_TASK, RawClient, call, shown_output  # noqa: E402

IMAGE = "agentrl-os:default"


def problems(data: Path) -> list[tuple[dict[str, Any], Path]]:
    base = data / "agentbench/os_interaction"
    items = []
    for group in "1234567":
        for path in sorted((base / "data" / group).glob("*.json")):
            raw = json.loads(path.read_text())
            items += [(item, base / "scripts" / group) for item in (raw if isinstance(raw, list) else [raw])]
    return items


def timed(function: Any, *args: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = function(*args)
    return value, (time.perf_counter() - start) * 1000


def build_image() -> float:
    client = docker.from_env()
    try:
        client.images.remove(IMAGE, force=True)
    except docker.errors.ImageNotFound:
        pass
    start = time.monotonic()
    subprocess.run(["bash", str(REPO / "scripts" / "build_os_image.sh")], check=True)
    return round(time.monotonic() - start, 1)


def container_memory_mb(client: docker.DockerClient, session: str) -> float:
    (container,) = client.containers.list(
        filters={"label": [f"agentrl.session={session}", "agentrl.task=os"]}
    )
    stats = container.stats(stream=False)
    return float(stats["memory_stats"].get("usage", 0)) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=None, help="first N test problems (default: all 144)")
    parser.add_argument("--open", type=int, default=16, help="sessions held open for the memory figure")
    parser.add_argument("--build", action="store_true", help="rebuild the image and time it")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "os_latency.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault(
        "DOCKER_HOST",
        subprocess.run(
            ["bash", str(REPO / "scripts/dockerd.sh"), "host"], capture_output=True, text=True
        ).stdout.strip(),
    )
    build_s = build_image() if args.build else None
    engine = docker.from_env()
    with tempfile.TemporaryDirectory(prefix="os-bench-") as tmp:
        data = Path(tmp) / "data"
        install_from(vendored_data_dir(), data)
        items = problems(data)[: args.samples]
        with EnvServers(Path(tmp) / "logs") as servers:
            controller = servers.controller(log_level="warning")
            worker = servers.worker(
                controller, OS_TASK, task_kwargs={"data_dir": str(data)}, log_level="warning"
            )
            servers.wait_routable(controller, "os", timeout_s=60)
            client = RawClient(controller.api)
            starts, steps, answers, failed = [], [], [], []
            for index, (item, scripts) in enumerate(items):
                (session, opening), ms = timed(client.start, index)
                starts.append(ms)
                if opening["finish"]:
                    failed.append(index)
                    continue
                match = item["evaluation"].get("match")
                if match is not None:
                    answer = match if isinstance(match, str) else match["answer"]
                else:
                    example = item["evaluation"]["example"]
                    example = {"code": example} if isinstance(example, str) else example
                    code = example["code"] if "code" in example else (scripts / example["file"]).read_text()
                    if example.get("language", "bash") == "python":
                        code = "python3 -c " + json.dumps(code)
                    ran, ms = timed(client.step, session, call("bash_action", {"script": code}))
                    steps.append(ms)
                    answer = shown_output(ran).strip()
                done, ms = timed(client.answer, session, answer)
                answers.append(ms)
                if done["reward"] != 1.0:
                    failed.append(index)
            idle = rss_mb(worker.pid)
            held = [client.start(0)[0] for _ in range(args.open)]
            container_mb = [container_memory_mb(engine, session) for session in held]
            loaded = rss_mb(worker.pid)
            for session in held:
                client.cancel(session)
    result = {
        "start_sample": percentiles(starts, 1),
        "bash_action": percentiles(steps, 1),
        "answer_with_check": percentiles(answers, 1),
        "gold_reward_1": len(items) - len(failed),
        "samples": len(items),
        "gold_not_1": failed,
        "container_memory_mb": {
            "mean": round(statistics.fmean(container_mb), 1),
            "max": round(max(container_mb), 1),
            "limit": 1024,
        },
        "worker_rss_idle_mb": round(idle, 1),
        "worker_mb_per_open_session": round((loaded - idle) / args.open, 2),
        "open_sessions": args.open,
        "image_build_s": build_s,
        "image_size_mb": round(engine.images.get(IMAGE).attrs["Size"] / 1e6),
    }
    print(json.dumps(result, indent=1))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}
    out.write_text(json.dumps({"machine": machine, "results": result}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
