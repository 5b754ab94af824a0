"""os through the real controller -> worker path on a real Docker engine, driven by the raw protocol.

Example solutions score 1 and wrong answers 0 on a sample of the test split; invalid steps,
command timeouts and a killed container give the documented statuses and the worker keeps
serving; a session's container is gone after the session, and after the worker is SIGKILLed
(the next worker sweeps it). One controller and worker serve the whole module.
"""

from __future__ import annotations

import json
import platform
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from os_helpers import OS_TASK, RawClient, call, play_gold, shown_output

from agentrl_ext.env.providers.docker import LABEL_SESSION, LABEL_TASK
from agentrl_ext.testing.env_servers import EnvServers, list_workers, wait_until
from envs.os.prompts import SYSTEM_PROMPT, TOOLS

pytestmark = pytest.mark.docker

TIMEOUT_S = 3.0


def raw_test_problems(data_dir: Path) -> list[tuple[dict[str, Any], Path]]:
    """The raw test problems in index order, with their scripts folder (read here, not by the worker)."""
    base = data_dir / "agentbench/os_interaction"
    items = []
    for group in "1234567":
        for path in sorted((base / "data" / group).glob("*.json")):
            raw = json.loads(path.read_text())
            items += [(item, base / "scripts" / group) for item in (raw if isinstance(raw, list) else [raw])]
    return items


def sampled_indices(items: list[tuple[dict[str, Any], Path]]) -> list[int]:
    """The first problem of each group, the first two match problems, every problem with a start script."""
    chosen: dict[int, None] = {}
    first_of_group: dict[Path, int] = {}
    for index, (_item, scripts) in enumerate(items):
        first_of_group.setdefault(scripts, index)
    chosen.update(dict.fromkeys(first_of_group.values()))
    chosen.update(
        dict.fromkeys([i for i, (item, _) in enumerate(items) if "match" in item["evaluation"]][:2])
    )
    chosen.update(dict.fromkeys(i for i, (item, _) in enumerate(items) if "start" in item))
    return sorted(chosen)


@pytest.fixture(scope="module")
def os_worker(tmp_path_factory, os_data_dir, os_docker_host) -> Iterator[tuple[RawClient, EnvServers]]:
    kwargs = {"data_dir": str(os_data_dir), "command_timeout_s": TIMEOUT_S, "on_invalid_action": "end"}
    with EnvServers(tmp_path_factory.mktemp("os")) as servers:
        controller = servers.controller()
        servers.worker(controller, OS_TASK, name="os", task_kwargs=kwargs)
        servers.wait_routable(controller, "os", timeout_s=60)
        yield RawClient(controller.api), servers


@pytest.fixture(scope="module")
def engine(os_docker_host) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=os_docker_host, timeout=60)
    yield client
    client.close()


def containers(engine: docker.DockerClient, session: str | None = None) -> list[Any]:
    labels = [f"{LABEL_TASK}=os"] + ([f"{LABEL_SESSION}={session}"] if session else [])
    return engine.containers.list(all=True, filters={"label": labels})


def test_opening_turn_is_agentbench_fc(os_worker, os_data_dir):
    client, _ = os_worker
    session, opening = client.start(0)
    assert opening["tools"] == TOOLS and opening["status"] == "running" and not opening["finish"]
    description = raw_test_problems(os_data_dir)[0][0]["description"]
    assert opening["messages"] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": f"Now, I will start a new problem in a new OS. My problem is:\n\n{description}",
        },
    ]
    client.cancel(session)


def test_example_solutions_score_1_and_wrong_answers_0(os_worker, os_data_dir):
    client, _ = os_worker
    items = raw_test_problems(os_data_dir)
    indices = sampled_indices(items)
    assert len(indices) >= 12
    for index in indices:
        item, scripts = items[index]
        gold = play_gold(client, index, item, scripts)
        assert (gold["finish"], gold["status"], gold["reward"]) == (True, "completed", 1.0), (index, gold)
        session, _ = client.start(index)  # wrong: no work done, an answer that is no answer
        wrong = client.answer(session, "certainly-not-the-answer")
        assert (wrong["finish"], wrong["status"], wrong["reward"]) == (True, "completed", 0.0), (index, wrong)


# The reward hack: replace every copy of an interpreter the check scripts use with `exit 0`
# (unlinked first: a running program cannot be written over), then answer anything.
def replace_with_exit_0(*programs: str) -> str:
    return (
        f"for p in /usr/local/bin/python3 $(type -aP {' '.join(programs)} | sort -u); do "
        'rm -f "$p"; printf \'#!/bin/sh\\nexit 0\\n\' > "$p"; chmod 755 "$p"; done; '
        f"{programs[0]} -c 'exit 3'; echo replaced:$?"
    )


@pytest.mark.parametrize(
    ("index", "programs"),
    [(0, ("python3", "python3.11")), (11, ("bash", "timeout"))],
    ids=["python-check", "bash-check"],
)
def test_replacing_the_check_interpreter_with_exit_0_scores_0(os_worker, os_data_dir, index, programs):
    client, _ = os_worker
    item = raw_test_problems(os_data_dir)[index][0]
    language = "python" if "python" in json.dumps(item["evaluation"]["check"]) else "bash"
    assert language == ("python" if programs[0] == "python3" else "bash")  # the data still checks so
    session, _ = client.start(index)
    hacked = client.bash(session, replace_with_exit_0(*programs))
    assert "replaced:0" in shown_output(hacked), hacked  # the container's own interpreter now passes all
    wrong = client.answer(session, "certainly-not-the-answer")
    assert (wrong["finish"], wrong["status"], wrong["reward"]) == (True, "completed", 0.0), wrong


def exit_0_elf() -> bytes:
    """A static x86-64 program that only exits 0 (ELF header, one loadable segment, 12 bytes of
    code: ``xor edi, edi; mov eax, 60; syscall``), written out by hand."""
    base, code = 0x10000000, bytes.fromhex("31ffb83c0000000f05")
    size = 64 + 56 + len(code)
    header = b"\x7fELF\x02\x01\x01" + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, base + 120, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)
    return header + segment + code


def fake(path: str, body: str = "exit 0") -> str:
    """Bash that replaces ``path`` (unlinked first: a running program cannot be written over)."""
    return f"rm -f {path}; printf '#!/bin/sh\\n{body}\\n' > {path}; chmod 755 {path}"


# Hacks on the programs a check calls by name, each of which makes a check pass without the work
# (measured: reward 1.0 before the integrity check): (index, bash of the hack, answer, what the
# agent sees of the fake afterwards).
NAMED_PROGRAM_HACKS = {
    # ls -l / | grep data | awk '{... exit 0 ...}': every program of the pipeline exits 0
    "replace-grep-awk-ls": (
        54,
        "; ".join(fake(f"/usr/bin/{name}") for name in ("grep", "awk", "ls", "wc"))
        + "; grep -c root /etc/passwd; echo faked:$?",
        "done",
        "faked:0",
    ),
    # (find ... -ls && find ... -ls) | [ empty ]: a find earlier on PATH that prints nothing
    "shadow-find-on-path": (
        51,
        fake("/usr/local/bin/find") + "; find / -name passwd; echo faked:$?",
        "done",
        "faked:0",
    ),
    # the check re-runs the example (find $PATH ... | wc -l) and compares: wc prints the answer
    "wc-prints-the-answer": (7, fake("/usr/bin/wc", "echo 7") + "; echo x | wc -l", "7", "7"),
}
if platform.machine() == "x86_64":
    # the loader every dynamically linked program starts with (timeout, bash, python3 included)
    # replaced by a program that exits 0: before, the check's own interpreters exited 0 with it
    NAMED_PROGRAM_HACKS["replace-the-dynamic-loader"] = (
        54,
        f'python3 -c \'open("/tmp/l", "wb").write(bytes.fromhex("{exit_0_elf().hex()}"))\' && '
        'chmod 755 /tmp/l && mv -f /tmp/l "$(readlink -f /lib64/ld-linux-x86-64.so.2)"',
        "done",
        "",  # nothing shows: the shell's own programs exit 0 before printing
    )


@pytest.mark.parametrize(
    ("index", "hack", "answer", "seen"), NAMED_PROGRAM_HACKS.values(), ids=NAMED_PROGRAM_HACKS
)
def test_programs_a_check_calls_by_name_replaced_by_fakes_score_0(os_worker, index, hack, answer, seen):
    client, _ = os_worker
    session, _ = client.start(index)
    hacked = client.bash(session, hack)
    assert seen in shown_output(hacked), hacked  # the fake is in place: the container's programs lie
    done = client.answer(session, answer)
    assert (done["finish"], done["status"], done["reward"]) == (True, "completed", 0.0), done


# The rest of what the integrity check covers, planted beside item 54's real answer (so the check
# itself passes): each makes the episode score 0.
OTHER_TAMPERING = {
    # a bash check that starts python3 imports site, which runs .pth lines
    "python-start-up-hook": "echo 'import os' > /usr/local/lib/python3.11/dist-packages/agentrl.pth",
    # a library the loader puts into every program
    "ld-so-preload": "echo /tmp/nothing.so > /etc/ld.so.preload",
    # the loader's path /lib64/ld-linux-x86-64.so.2 goes through this link
    "lib64-link-replaced": "ln -sfn usr/lib64 /lib64 && ls /lib64/ld-linux-x86-64.so.2",
}


@pytest.mark.parametrize("planted", OTHER_TAMPERING.values(), ids=OTHER_TAMPERING)
def test_the_other_tampering_the_integrity_check_covers_scores_0(os_worker, planted):
    client, _ = os_worker
    session, _ = client.start(54)
    client.bash(session, f"mkdir -p /usr/local/lib/python3.11/dist-packages; {planted}")
    client.bash(session, "chmod g+s /data && chmod +t /data")  # the real answer
    done = client.answer(session, "done")
    assert (done["finish"], done["status"], done["reward"]) == (True, "completed", 0.0), done


def test_changes_that_leave_the_programs_as_they_were_are_not_tampering(os_worker, os_data_dir):
    """Item 50's answer is ``chmod u-s /usr/bin/find`` (a mode change of one of the image's
    programs); a new program under a name the image lacks is fine too (item 38's ``count``)."""
    client, _ = os_worker
    items = raw_test_problems(os_data_dir)
    assert "SUID" in items[50][0]["description"]  # the data still asks so
    done = play_gold(client, 50, *items[50])
    assert (done["status"], done["reward"]) == ("completed", 1.0), done
    session, _ = client.start(54)
    client.bash(session, fake("/usr/local/bin/agentrl-own-tool") + "; chmod g+s /data && chmod +t /data")
    done = client.answer(session, "done")
    assert (done["status"], done["reward"]) == ("completed", 1.0), done


@pytest.mark.parametrize("index", [26, 55])
def test_a_failed_init_script_ends_unknown_with_the_reason(os_worker, index):
    client, _ = os_worker
    _, opening = client.start(index)
    assert (opening["finish"], opening["status"], opening["reward"]) == (True, "unknown", 0.0), opening
    assert (opening.get("error") or "").startswith("init script 0 failed with exit code "), opening


def test_shell_state_carries_over_and_long_output_is_cut(os_worker):
    client, _ = os_worker
    session, _ = client.start(0)
    client.bash(session, "mkdir -p /srv/work && cd /srv/work && count=41")
    shown = client.bash(session, "pwd; echo $((count + 1))")
    assert shown["messages"][0] == {
        "role": "tool",
        "tool_call_id": "call-0",
        "content": "The output of the OS:\n\n/srv/work\n42\n",
    }
    long = client.bash(session, "seq 1 400")["messages"][0]["content"]
    full = "".join(f"{n}\n" for n in range(1, 401))  # 1492 characters
    assert long == "The output of the OS:\n\n" + full[:780] + "\n[truncated because the output is too long]"
    assert client.bash(session, "true")["messages"][0]["content"] == "The output of the OS is empty."
    assert client.finish(session)["status"] == "completed"


def test_command_timeout_is_reported_and_the_shell_goes_on(os_worker):
    client, _ = os_worker
    session, _ = client.start(0)
    timed_out = client.bash(session, "echo started; sleep 30; echo never")
    text = timed_out["messages"][0]["content"]
    assert timed_out["status"] == "running" and text.startswith("The output of the OS:\n\nstarted\n")
    assert text.endswith(f"[the command did not finish within {TIMEOUT_S:g} seconds and was stopped]")
    assert "never" not in text
    assert shown_output(client.bash(session, "echo alive")) == "alive\n"
    client.cancel(session)


@pytest.mark.parametrize(
    ("step", "status"),
    [
        ({"content": "ls"}, "agent validation failed"),  # no tool call
        ({"calls": [call("rm_everything", {"script": "ls"})]}, "agent invalid action"),
        ({"calls": [call("bash_action", "{not json")]}, "agent validation failed"),
        ({"calls": [call("bash_action", {})]}, "agent validation failed"),  # no script
        ({"calls": [call("answer_action", {})]}, "agent validation failed"),  # no answer
    ],
    ids=["no-tool-call", "unknown-tool", "bad-json", "no-script", "no-answer"],
)
def test_invalid_steps_end_with_documented_status(os_worker, engine, step, status):
    client, _ = os_worker
    session, _ = client.start(0)
    answer = client.step(session, *step.get("calls", []), content=step.get("content"))
    assert (answer["finish"], answer["status"], answer["reward"]) == (True, status, 0.0), answer
    wait_until(lambda: not containers(engine, session), timeout_s=30, what="the session's container to go")
    session, _ = client.start(0)  # the worker keeps serving
    assert client.finish(session)["status"] == "completed"


def test_round_limit_ends_with_task_limit_reached(os_worker):
    client, _ = os_worker
    session, _ = client.start(0)
    for _ in range(7):
        assert client.bash(session, "true")["status"] == "running"
    last = client.bash(session, "true")
    assert (last["finish"], last["status"], last["reward"]) == (True, "task limit reached", 0.0)


def test_killed_container_gives_task_error_and_worker_keeps_serving(os_worker, engine):
    client, _ = os_worker
    session, _ = client.start(0)
    (container,) = containers(engine, session)
    container.kill()
    answer = client.bash(session, "ls")
    assert (answer["finish"], answer["status"]) == (True, "task error"), answer
    wait_until(
        lambda: not containers(engine, session), timeout_s=30, what="the killed container to be removed"
    )
    session, _ = client.start(0)
    assert shown_output(client.bash(session, "echo fine")) == "fine\n"
    client.cancel(session)


def test_containers_are_removed_after_each_session(os_worker, engine):
    client, _ = os_worker
    session, _ = client.start(0)
    (container,) = containers(engine, session)
    attrs = container.attrs["HostConfig"]
    assert (attrs["Memory"], attrs["MemorySwap"], attrs["NanoCpus"]) == (1 << 30, 1 << 30, 2_000_000_000)
    assert attrs["PidsLimit"] == 1024 and attrs["NetworkMode"] == "none"
    client.finish(session)
    wait_until(
        lambda: not containers(engine, session), timeout_s=30, what="a finished session's container to go"
    )
    session, _ = client.start(0)
    assert len(containers(engine, session)) == 1
    client.cancel(session)
    wait_until(
        lambda: not containers(engine, session), timeout_s=30, what="a cancelled session's container to go"
    )
    workers = list_workers(client.api)["os"]
    assert len(workers) == 1 and workers[0]["healthy"]


def test_containers_of_a_killed_worker_are_swept_when_a_worker_starts(tmp_path, os_data_dir, engine):
    kwargs = {"data_dir": str(os_data_dir)}
    with EnvServers(tmp_path) as servers:
        controller = servers.controller()
        servers.worker(controller, OS_TASK, name="doomed", task_kwargs=kwargs)
        servers.wait_routable(controller, "os", timeout_s=60)
        client = RawClient(controller.api)
        session, _ = client.start(0)
        assert len(containers(engine, session)) == 1
        servers.kill("doomed")  # SIGKILL: no cleanup runs
        assert len(containers(engine, session)) == 1
        servers.worker(controller, OS_TASK, name="next", task_kwargs=kwargs)
        assert containers(engine, session) == []  # swept during the new worker's setup


def test_default_rule_answers_like_agentbench_fc_and_counts_rounds(tmp_path, os_data_dir, os_docker_host):
    kwargs = {"data_dir": str(os_data_dir)}  # the default rule, AgentBench-FC's
    with EnvServers(tmp_path) as servers:
        controller = servers.controller()
        servers.worker(controller, OS_TASK, task_kwargs=kwargs)
        servers.wait_routable(controller, "os", timeout_s=60)
        client = RawClient(controller.api)
        session, _ = client.start(0)
        answer = client.step(session, content="ls")
        assert answer["status"] == "running" and answer["messages"] == [
            {"role": "user", "content": "No executable tool calls found. Please call a tool instead"}
        ]
        answer = client.step(session, call("rm_everything", {"x": 1}))
        assert answer["messages"] == [
            {
                "role": "tool",
                "tool_call_id": "call-0",
                "content": "Invalid function call. Please call a tool instead",
            }
        ]
        assert client.finish(session)["status"] == "completed"
        # each turn without a tool call counts against the 8-round limit
        session, _ = client.start(0)
        for _ in range(7):
            assert client.step(session, content="ls")["status"] == "running"
        last = client.step(session, content="ls")
        assert (last["finish"], last["status"], last["reward"]) == (True, "task limit reached", 0.0), last
