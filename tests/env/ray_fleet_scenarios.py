"""The fleet on a real multi-node Ray cluster, as one scenario run in a loopback-only network
namespace (see :mod:`agentrl_ext.testing.ray_cluster`); writes what it observed as JSON.

    unshare --net -- sh -c 'ip link set lo up && exec python tests/env/ray_fleet_scenarios.py OUT.json'

tests/env/test_ray_fleet_on_cpu.py runs it and checks the observations. One cluster for every
step (a Ray cluster takes ~15 s to start on 2 cores):

1. a head and two environment nodes (4 ``agentrl_env`` slots each); the fleet: guess with 3
   workers spread over the nodes, calc with one worker per node (``per_node``);
2. secrets: nowhere in a process's command line or environment, nor in Ray's actor and task tables;
3. a node lost mid-run: 8 slow guess episodes in flight; every process of node B (its raylet,
   Ray's workers, our servers) is frozen with SIGSTOP: a machine that vanished answers nothing
   and closes no connection. Every episode ends (success or ``task error``) and the time is
   measured; Ray declares B dead and restarts its guess worker on the survivor; the fleet is
   back to 3 routable guess workers, and the next batch of episodes all succeed;
4. a node joins: a calc worker appears on it and takes sessions;
5. stop: no actor alive, no controller or worker process, no file left.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

SECRET = "fleet-secret-" + "x7Q2" * 6
HEARTBEAT_S = 1.0
HEARTBEAT_TIMEOUT_S = 4.0
CHECK_INTERVAL_S = 0.5
NODE_DEATH_S = 8.0  # Ray's default is ~65 s (bench/ray_fleet.py measures both)


def _workers(api: str) -> dict[str, list[dict[str, Any]]]:
    from agentrl_ext.env.launcher.processes import list_workers

    return list_workers(api)


def _routable(api: str, task: str) -> list[dict[str, Any]]:
    return [w for w in _workers(api).get(task, []) if w["healthy"] and w["routable"]]


async def _episodes(api: str, task: str, indices: list[int], step_delay_s: float) -> list[dict[str, Any]]:
    """Play ``indices`` with the task's expert, ``step_delay_s`` before every move; each episode's
    status, error and end time (monotonic)."""
    from agentrl_ext.data.expert import expert_policy
    from agentrl_ext.env.client import ControllerClient
    from agentrl_ext.rollout.episode import ScriptedActor, drive_episode

    class SlowExpert(ScriptedActor):
        async def act(self, episode: Any) -> Any:
            await asyncio.sleep(step_delay_s)
            return await super().act(episode)

    async with ControllerClient(api) as client:

        async def one(index: int) -> dict[str, Any]:
            episode = await drive_episode(client, task, index, SlowExpert(expert_policy(task)), max_turns=32)
            return {"status": str(episode.status), "error": episode.error, "ended": time.monotonic()}

        return list(await asyncio.gather(*(one(i) for i in indices)))


def _ray_tables() -> str:
    from ray.util.state import list_actors, list_tasks

    actors = list_actors(detail=True, limit=1000)
    tasks = list_tasks(detail=True, limit=1000)
    return json.dumps(
        [a.__dict__ if hasattr(a, "__dict__") else a for a in actors], default=str
    ) + json.dumps([t.__dict__ if hasattr(t, "__dict__") else t for t in tasks], default=str)


def _environ_has(pid: int, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return text.encode() in handle.read()
    except OSError:
        return False


def fleet_of(cluster: Any, tasks: list[str], **options: Any) -> Any:
    """An ``EnvStack`` of ``tasks`` placed on ``cluster`` (a ``LocalCluster``), on a free port."""
    from agentrl_ext.env.launcher.processes import free_port
    from agentrl_ext.env.launcher.stack import EnvStack

    return EnvStack(tasks=tasks, port=free_port(), placement="ray", ray_address=cluster.address, **options)


def main(out: Path) -> None:
    import ray

    from agentrl_ext.testing.ray_cluster import LocalCluster, server_processes

    seen: dict[str, Any] = {}
    cluster = LocalCluster(dashboard=True, node_death_s=NODE_DEATH_S)
    secret_file = out.parent / "secret.txt"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o600)
    try:
        node_a = cluster.add_env_node(4)
        node_b = cluster.add_env_node(4)
        # 0. a fleet the cluster cannot host is refused before anything starts, naming the fix
        try:
            fleet_of(cluster, ["guess"], replicas={"guess": 9}).start()
            seen["capacity_error"] = None
        except ValueError as exc:
            seen["capacity_error"] = str(exc)
        import ray as _ray

        seen["connected_after_refusal"] = _ray.is_initialized()
        # a start that fails half-way (a worker whose task refuses its kwargs) stops what started
        try:
            fleet_of(cluster, ["guess"], kwargs={"guess": {"high": 1}}, ready_timeout_s=60).start()
            seen["failed_start_error"] = None
        except RuntimeError as exc:
            seen["failed_start_error"] = str(exc)
        seen["servers_after_failed_start"] = [argv for _pid, argv in server_processes()]
        seen["connected_after_failed_start"] = _ray.is_initialized()
        stack = fleet_of(
            cluster,
            ["guess", "calc"],
            replicas={"guess": 3},
            per_node={"calc": 1},
            secret_file=str(secret_file),
            heartbeat_interval=HEARTBEAT_S,
            controller_options={"heartbeat_timeout": HEARTBEAT_TIMEOUT_S, "check_interval": CHECK_INTERVAL_S},
            ready_timeout_s=120,
        )
        t0 = time.monotonic()
        stack.start()
        seen["bring_up_s"] = time.monotonic() - t0
        fleet = stack.fleet
        assert fleet is not None
        placed = [p for p in fleet.placements() if "error" not in p]
        seen["placements"] = placed
        seen["describe"] = stack.describe()
        ids = {"a": node_a.node_id, "b": node_b.node_id, "head": ray.get_runtime_context().get_node_id()}
        seen["node_ids"] = ids
        pids = [p["pid"] for p in placed]

        # 2. secrets
        procs = server_processes()
        seen["server_processes"] = len(procs)
        seen["secret_in_argv"] = any(SECRET in argv for _pid, argv in procs)
        seen["secret_in_environ"] = any(_environ_has(pid, SECRET) for pid, _argv in procs)
        seen["secret_in_ray_tables"] = SECRET in _ray_tables()
        seen["secret_files_left"] = [str(f) for p in placed for f in Path(p["log"]).parent.glob("*.secret")]

        # 3. node B lost mid-run
        api = stack.api
        on_b = [p for p in placed if p["node_id"] == ids["b"]]
        seen["workers_on_b"] = [p["name"] for p in on_b]
        loop = asyncio.new_event_loop()
        in_flight = loop.create_task(_episodes(api, "guess", list(range(10_000, 10_008)), step_delay_s=1.0))
        loop.run_until_complete(asyncio.sleep(2.5))
        frozen = cluster.freeze(node_b)  # the node vanishes: nothing on it answers or exits
        seen["frozen_processes"] = len(frozen)
        lost_at = time.monotonic()
        results = loop.run_until_complete(in_flight)
        seen["mid_run"] = [{**r, "after_loss_s": r["ended"] - lost_at} for r in results]
        # recovery: 3 routable guess workers again, none of them on B's addresses
        b_addresses = {p["api"] for p in on_b}

        def recovered() -> bool:
            guess = _routable(api, "guess")
            return len(guess) >= 3 and not b_addresses & {w["address"] for w in guess}

        while not recovered():
            if time.monotonic() - lost_at > 180:
                raise TimeoutError(f"no recovery: {_workers(api)}")
            time.sleep(0.2)
        seen["recovery_s"] = time.monotonic() - lost_at
        seen["after_loss_workers"] = _workers(api)
        cluster.remove(node_b)  # Ray declared it dead long ago; now its processes really go
        batch = loop.run_until_complete(
            _episodes(api, "guess", list(range(10_010, 10_016)), step_delay_s=0.0)
        )
        seen["next_batch"] = [r["status"] for r in batch]

        # 4. a node joins
        node_c = cluster.add_env_node(4)
        ids["c"] = node_c.node_id
        joined_at = time.monotonic()
        while True:
            calc_on_c = [
                p
                for p in fleet.placements()
                if "error" not in p and p["node_id"] == ids["c"] and p["name"].startswith("calc")
            ]
            if calc_on_c and any(w["address"] == calc_on_c[0]["api"] for w in _routable(api, "calc")):
                break
            if time.monotonic() - joined_at > 120:
                raise TimeoutError(f"no calc worker on the new node: {fleet.placements()}")
            time.sleep(0.5)
        seen["join_s"] = time.monotonic() - joined_at
        seen["calc_on_c"] = calc_on_c[0]["api"]
        # it takes traffic: open sessions spread to the worker with the most free slots
        import httpx

        headers = {}
        sessions = []
        for i in range(6):
            answer = httpx.post(
                f"{api}/start_sample", json={"name": "calc", "index": 10_000 + i}, headers=headers, timeout=30
            )
            answer.raise_for_status()
            sessions.append(int(answer.headers["session_id"]))
        open_by = httpx.get(f"{api}/list_sessions", params={"name": "calc"}, timeout=30).json()
        seen["calc_sessions_by_worker"] = {
            address: sum(s["worker"] == address for s in open_by)
            for address in {s["worker"] for s in open_by}
        }
        for sid in sessions:
            httpx.post(f"{api}/cancel", headers={"session_id": str(sid)}, timeout=30)
        loop.close()

        # 5. stop
        live = [p for p in fleet.placements() if "error" not in p]
        pids += [p["pid"] for p in live]
        folders = {str(Path(p["log"]).parent) for p in [*placed, *live]}
        t0 = time.monotonic()
        stack.stop()
        seen["stop_s"] = time.monotonic() - t0
        ray.init(address=cluster.address, log_to_driver=False)
        from ray.util.state import list_actors

        deadline = time.monotonic() + 30
        while True:
            alive = [a for a in list_actors(limit=1000) if a.state not in ("DEAD",)]
            if not alive or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        seen["actors_alive_after_stop"] = [f"{a.class_name} {a.state}" for a in alive]
        ray.shutdown()
        seen["server_processes_after_stop"] = [argv for _pid, argv in server_processes()]

        # 6. the fleet's driver killed (SIGKILL: no clean-up of its own): Ray ends its actors,
        # and each server process dies with its actor
        orphan = fleet_of(cluster, ["guess"], fleet_process=True, ready_timeout_s=120)
        orphan.start()
        seen["servers_under_killed_driver"] = len(server_processes())
        assert orphan.driver is not None
        orphan.driver.kill()
        killed_at = time.monotonic()
        while server_processes() and time.monotonic() - killed_at < 60:
            time.sleep(0.5)
        seen["servers_left_after_driver_killed"] = [argv for _pid, argv in server_processes()]
        seen["driver_killed_cleanup_s"] = time.monotonic() - killed_at

        # 7. Ctrl-C to agentrl-envs up --placement ray: it stops everything itself and exits
        interrupted = fleet_of(cluster, ["guess"], fleet_process=True, ready_timeout_s=120)
        interrupted.start()
        assert interrupted.driver is not None and interrupted.driver.proc is not None
        seen["servers_before_ctrl_c"] = len(server_processes())
        interrupted.driver.proc.send_signal(signal.SIGINT)
        seen["ctrl_c_exit"] = interrupted.driver.proc.wait(120)
        seen["servers_left_after_ctrl_c"] = [argv for _pid, argv in server_processes()]
        seen["pids_alive_after_stop"] = [
            pid
            for pid in pids
            if Path(f"/proc/{pid}").exists()
            and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        ]
        seen["folders_left"] = sorted(
            f for f in folders if Path(f).exists() and Path(f).parent == Path(f).parent
        )
        # B's folders stay: that node "vanished" (its processes got SIGTERM but nobody removed files)
        seen["folders_left_on_survivors"] = sorted(
            str(Path(p["log"]).parent) for p in live if Path(Path(p["log"]).parent).exists()
        )
    finally:
        cluster.shutdown()
        out.write_text(json.dumps(seen, indent=1, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
