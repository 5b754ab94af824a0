"""dbbench through the real controller -> worker path, on both backends, driven by the raw protocol.

Gold answers score 1 and wrong ones 0 for a sample of every SQL type of ``standard``; invalid
steps end with the documented statuses; SQL errors and timeouts go back to the agent; the worker
keeps serving throughout.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dbbench_helpers import DBBENCH_TASK, RawClient, call, start_private_mariadb

from agentrl_ext.testing.env_servers import EnvServers, list_workers, wait_until
from envs.dbbench.backends import ServerAddress
from envs.dbbench.data import load_split
from envs.dbbench.prompts import SYSTEM_PROMPT, TOOLS

STATEMENT_TIMEOUT_S = 2.0
# a statement that runs until the statement timeout stops it
ENDLESS = {
    "sqlite": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
    "mariadb": "SELECT SLEEP(30)",
}


def first_of_each_type(data_dir: Path) -> dict[str, int]:
    _, samples = load_split("standard", data_dir)
    first: dict[str, int] = {}
    for index, sample in enumerate(samples):
        first.setdefault(sample.kind, index)
    return first


@pytest.fixture(scope="module", params=["sqlite", "mariadb"])
def dbbench(request, tmp_path_factory, dbbench_data_dir) -> Iterator[tuple[str, RawClient, EnvServers]]:
    """(backend, raw client, servers): a controller and one dbbench worker on that backend."""
    backend = request.param
    kwargs: dict[str, Any] = {
        "data_dir": str(dbbench_data_dir),
        "backend": backend,
        "statement_timeout_s": STATEMENT_TIMEOUT_S,
        "on_invalid_action": "end",
    }
    if backend == "mariadb":
        kwargs["mariadb_url"] = request.getfixturevalue("mariadb_server").url
    with EnvServers(tmp_path_factory.mktemp(f"dbbench-{backend}")) as servers:
        controller = servers.controller()
        servers.worker(controller, DBBENCH_TASK, name="dbbench", task_kwargs=kwargs)
        servers.wait_routable(controller, "dbbench")
        yield backend, RawClient(controller.api), servers


def test_opening_turn_is_agentbench_fc_on_cpu(dbbench, dbbench_data_dir):
    _, client, _ = dbbench
    _, samples = load_split("standard", dbbench_data_dir)
    session, opening = client.start(0)
    assert opening["tools"] == TOOLS and opening["status"] == "running" and not opening["finish"]
    system, user = opening["messages"]
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    entry = samples[0].entry
    assert user["content"] == (
        f"Additional table information about the question: {entry['add_description']}\n"
        f"Question: {entry['description']}\n"
    )
    client.commit(session, ["x"])


def test_gold_answers_score_1_and_wrong_ones_0_for_every_sql_type_on_cpu(dbbench, dbbench_data_dir):
    backend, client, _ = dbbench
    _, samples = load_split("standard", dbbench_data_dir)
    types = first_of_each_type(dbbench_data_dir)
    assert len(types) == 10  # other, counting, comparison, ranking, 4 aggregations, INSERT, UPDATE
    for kind, index in types.items():
        sample = samples[index]
        table = sample.tables[0]
        # correct
        session, _ = client.start(index)
        counted = client.sql(session, f"SELECT COUNT(*) FROM `{table.name}`")
        assert counted["messages"] == [
            {"role": "tool", "tool_call_id": "call-0", "content": f"[({len(table.rows)},)]"}
        ], (backend, kind)
        if sample.modifies:
            changed = client.sql(session, sample.gold_sql)
            assert changed["messages"][0]["content"] == "[]", (backend, kind, changed)
            done = client.commit(session, ["done"])
        else:
            done = client.commit(session, list(sample.label))
        assert (done["finish"], done["status"], done["reward"]) == (True, "completed", 1.0), (
            backend,
            kind,
            done,
        )
        # wrong: another answer, or the table left as it was
        session, _ = client.start(index)
        done = client.commit(session, ["done"] if sample.modifies else ["certainly not the answer"])
        assert (done["finish"], done["status"], done["reward"]) == (True, "completed", 0.0), (
            backend,
            kind,
            done,
        )


def test_numeric_answers_match_within_tolerance_on_cpu(dbbench, dbbench_data_dir):
    _, client, _ = dbbench
    index = first_of_each_type(dbbench_data_dir)["aggregation-AVG"]
    _, samples = load_split("standard", dbbench_data_dir)
    value = float(samples[index].label[0])
    session, _ = client.start(index)
    assert client.commit(session, [f"{value + 0.005}"])["reward"] == 1.0
    session, _ = client.start(index)
    assert client.commit(session, [f"{value + 0.5}"])["reward"] == 0.0


@pytest.mark.parametrize(
    ("step", "status"),
    [
        ({"content": "The answer is 3."}, "agent validation failed"),  # no tool call
        ({"calls": [call("drop_everything", {"query": "x"})]}, "agent invalid action"),
        ({"calls": [call("execute_sql", "{not json")]}, "agent validation failed"),
        ({"calls": [call("execute_sql", "[1, 2]")]}, "agent validation failed"),  # not an object
        ({"calls": [call("execute_sql", {})]}, "agent validation failed"),  # no query
        ({"calls": [call("commit_final_answer", {})]}, "agent validation failed"),
    ],
    ids=["no-tool-call", "unknown-tool", "bad-json", "not-an-object", "no-query", "no-answers"],
)
def test_invalid_steps_end_with_documented_status_on_cpu(dbbench, step, status):
    _, client, _ = dbbench
    session, _ = client.start(3)
    answer = client.step(session, *step.get("calls", []), content=step.get("content"))
    assert (answer["finish"], answer["status"], answer["reward"]) == (True, status, 0.0), answer
    session, _ = client.start(3)  # the worker keeps serving
    assert client.commit(session, ["x"])["status"] == "completed"


def test_sql_errors_and_timeouts_go_back_to_the_agent_on_cpu(dbbench):
    backend, client, _ = dbbench
    session, _ = client.start(5)
    error = client.sql(session, "SELEC nothing FROM nowhere")
    assert error["status"] == "running" and not error["finish"]
    text = error["messages"][0]["content"]
    assert (
        ("syntax error" in text)
        if backend == "sqlite"
        else text.startswith("1064: You have an error in your SQL syntax")
    )
    timed_out = client.sql(session, ENDLESS[backend])
    assert timed_out["messages"][0]["content"] == "Error: SQL execution timed out."
    assert timed_out["status"] == "running"
    many = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300) SELECT x FROM c"
    shown = client.sql(session, many)["messages"][0]["content"]
    assert shown.startswith("[(1,), (2,), ") and shown.endswith("[TRUNCATED]") and len(shown) == 800 + 11
    assert client.commit(session, ["x"])["status"] == "completed"


def test_round_limit_ends_with_task_limit_reached_on_cpu(dbbench):
    _, client, _ = dbbench
    session, _ = client.start(1)
    for _ in range(14):
        assert client.sql(session, "SELECT 1")["status"] == "running"
    last = client.sql(session, "SELECT 1")
    assert (last["finish"], last["status"], last["reward"]) == (True, "task limit reached", 0.0)


def test_sessions_are_isolated_on_cpu(dbbench, dbbench_data_dir):
    _, client, _ = dbbench
    index = first_of_each_type(dbbench_data_dir)["INSERT"]
    _, samples = load_split("standard", dbbench_data_dir)
    table = samples[index].tables[0].name
    first, _ = client.start(index)
    second, _ = client.start(index)
    client.sql(first, f"DELETE FROM `{table}`")
    assert client.sql(first, f"SELECT COUNT(*) FROM `{table}`")["messages"][0]["content"] == "[(0,)]"
    expected = f"[({len(samples[index].tables[0].rows)},)]"
    assert client.sql(second, f"SELECT COUNT(*) FROM `{table}`")["messages"][0]["content"] == expected
    for session in (first, second):
        client.commit(session, ["x"])


def test_worker_is_healthy_after_everything_on_cpu(dbbench):
    _, client, _ = dbbench
    workers = list_workers(client.api)["dbbench"]
    assert len(workers) == 1 and workers[0]["healthy"] and workers[0]["open_sessions"] == 0


# ------------------------------------------------------------------------------------ feedback


def test_default_rule_answers_like_agentbench_fc_and_counts_rounds_on_cpu(tmp_path, dbbench_data_dir):
    kwargs = {"data_dir": str(dbbench_data_dir), "backend": "sqlite"}  # the default rule, AgentBench-FC's
    with EnvServers(tmp_path) as servers:
        controller = servers.controller()
        servers.worker(controller, DBBENCH_TASK, task_kwargs=kwargs)
        servers.wait_routable(controller, "dbbench")
        client = RawClient(controller.api)
        _, samples = load_split("standard", dbbench_data_dir)
        session, _ = client.start(0)
        answer = client.step(session, content="Let me think.")
        assert answer["status"] == "running" and answer["messages"] == [
            {"role": "user", "content": "Internal error: No tool calls found despite finish reason."}
        ]
        answer = client.step(session, call("drop_everything", {"x": 1}))
        assert answer["status"] == "running"
        assert answer["messages"] == [
            {
                "role": "tool",
                "tool_call_id": "call-0",
                "content": "Invalid function call. Please call a tool instead.",
            }
        ]
        assert client.commit(session, list(samples[0].label))["reward"] == 1.0
        # each turn without a tool call counts against the 15-round limit
        session, _ = client.start(0)
        for _ in range(14):
            assert client.step(session, content="Let me think.")["status"] == "running"
        last = client.step(session, content="Let me think.")
        assert (last["finish"], last["status"], last["reward"]) == (True, "task limit reached", 0.0), last


# ------------------------------------------------------------- what the agent does to its connection

# (statements, what the last one shows the agent): each ends or breaks the agent's own MariaDB
# connection or account; none may end the episode as "task error" (which the trainer drops
# instead of punishing): the agent sees the error and the episode goes on.
OWN_CONNECTION_ESCAPES = {
    "kill-connection": (["KILL CONNECTION_ID()"], "1927: Connection was killed"),
    "grant-to-self": (["GRANT ALL PRIVILEGES ON *.* TO CURRENT_USER()"], "1045: Access denied for user"),
    "idle-past-wait-timeout": (["SET SESSION wait_timeout = 1", "IDLE", "SELECT 1"], "[(1,)]"),
    "password-then-kill": (
        ["SET PASSWORD = PASSWORD('changed')", "KILL CONNECTION_ID()", "SELECT 1"],
        "[(1,)]",
    ),
    "drop-own-database-then-kill": (["DROP DATABASE `OWN`", "KILL CONNECTION_ID()", "SELECT 1"], "[(1,)]"),
    "lift-statement-time-limit": (
        ["SET SESSION max_statement_time = 0", ENDLESS["mariadb"]],
        "Error: SQL execution timed out.",
    ),
}


@pytest.mark.parametrize("dbbench", ["mariadb"], indirect=True)  # the agent's own MariaDB connection
@pytest.mark.parametrize("escape", list(OWN_CONNECTION_ESCAPES))
def test_what_the_agent_does_to_its_own_connection_is_not_a_task_error_on_cpu(
    dbbench, dbbench_data_dir, escape
):
    _backend, client, _ = dbbench
    statements, shown = OWN_CONNECTION_ESCAPES[escape]
    session, _ = client.start(0)
    own = client.sql(session, "SELECT DATABASE()")["messages"][0]["content"]  # [('dbbench_...',)]
    answer: dict[str, Any] = {}
    for statement in statements:
        if statement == "IDLE":  # longer than the wait_timeout the agent set: the server hangs up
            time.sleep(3)
            continue
        answer = client.sql(session, statement.replace("OWN", own[3:-4]))
        assert (answer["finish"], answer["status"]) == (False, "running"), (escape, statement, answer)
    assert answer["messages"][0]["content"].startswith(shown), (escape, answer)
    # the agent goes on and answers: scored like any episode (sample 0 is a question: the label wins)
    assert client.sql(session, "SELECT 1")["messages"][0]["content"] == "[(1,)]"
    label = list(load_split("standard", dbbench_data_dir)[1][0].label)
    done = client.commit(session, label)
    assert (done["finish"], done["status"], done["reward"]) == (True, "completed", 1.0), (escape, done)


@pytest.mark.parametrize("dbbench", ["mariadb"], indirect=True)  # the agent's own MariaDB connection
def test_a_modification_survives_the_agent_ending_its_connection_before_the_commit_on_cpu(
    dbbench, dbbench_data_dir
):
    _backend, client, _ = dbbench
    index = first_of_each_type(dbbench_data_dir)["INSERT"]
    sample = load_split("standard", dbbench_data_dir)[1][index]
    session, _ = client.start(index)
    client.sql(session, sample.gold_sql)
    client.sql(session, "SET SESSION wait_timeout = 1")
    time.sleep(3)  # the server hangs up on the idle connection; the tables are hashed all the same
    done = client.commit(session, ["done"])
    assert (done["finish"], done["status"], done["reward"]) == (True, "completed", 1.0), done


# ------------------------------------------------------------------------ no file on the host


@pytest.mark.parametrize("dbbench", ["sqlite"], indirect=True)  # SQLite runs the agent's SQL in the worker
def test_sqlite_sql_cannot_touch_the_hosts_files_on_cpu(dbbench, tmp_path):
    _backend, client, _ = dbbench
    target = tmp_path / "written-by-the-agent"
    target.mkdir()
    # (the attack, SQLite's refusal as the agent sees it)
    attacks = [
        (f"ATTACH DATABASE '{target / 'attached.db'}' AS stolen", "not authorized"),
        (f"VACUUM INTO '{target / 'copy.db'}'", "authorization denied"),
        (
            "SELECT load_extension('/usr/lib/x86_64-linux-gnu/libc.so.6')",
            "not authorized to use function: load_extension",
        ),
        (f"PRAGMA temp_store_directory = '{target}'", "not authorized"),
    ]
    session, _ = client.start(0)
    for attack, refusal in attacks:
        answer = client.sql(session, attack)
        assert answer["status"] == "running", (attack, answer)
        assert answer["messages"][0]["content"] == f"SQLite execution error: {refusal}", (attack, answer)
    assert list(target.iterdir()) == []
    # what stays in the episode's memory still works: a temporary database, a plain VACUUM
    assert client.sql(session, "ATTACH DATABASE ':memory:' AS scratch")["messages"][0]["content"] == "[]"
    assert client.sql(session, "VACUUM")["messages"][0]["content"] == "[]"
    assert client.commit(session, ["x"])["status"] == "completed"


# ------------------------------------------------------------------------------ a killed server


def test_killed_mariadb_gives_task_error_and_worker_recovers_on_cpu(tmp_path, dbbench_data_dir):
    server = start_private_mariadb(tmp_path / "mariadb")
    try:
        kwargs = {"data_dir": str(dbbench_data_dir), "backend": "mariadb", "mariadb_url": server.url}
        with EnvServers(tmp_path / "logs") as servers:
            controller = servers.controller()
            worker = servers.worker(controller, DBBENCH_TASK, task_kwargs=kwargs)
            servers.wait_routable(controller, "dbbench")
            client = RawClient(controller.api)
            session, _ = client.start(0)
            os.kill(server.pid, signal.SIGKILL)
            answer = client.sql(session, "SELECT 1")
            assert (answer["finish"], answer["status"]) == (True, "task error"), answer
            assert "MariaDB" in (answer.get("error") or ""), answer
            # no server: a new sample cannot open its database
            session, opening = client.start(0)
            assert (opening["finish"], opening["status"]) == (True, "task error"), opening
            # the server comes back: the same worker serves again
            server.start()
            session, _ = client.start(0)
            assert client.sql(session, "SELECT 1")["messages"][0]["content"] == "[(1,)]"
            assert worker.alive
    finally:
        server.stop()


@pytest.mark.parametrize("dbbench", ["mariadb"], indirect=True)  # SQLite episodes live in memory only
def test_episode_databases_are_dropped_also_on_cancel_on_cpu(dbbench, request):
    _, client, _ = dbbench
    import pymysql  # only where MariaDB runs

    address = ServerAddress.from_url(request.getfixturevalue("mariadb_server").url)

    def leftovers() -> list[str]:
        with pymysql.connect(unix_socket=address.unix_socket, user="root", ssl_disabled=True) as admin:
            with admin.cursor() as cursor:
                cursor.execute("SHOW DATABASES LIKE 'dbbench\\_%'")
                databases = [row[0] for row in cursor.fetchall()]
                cursor.execute("SELECT user FROM mysql.user WHERE user LIKE 'dbbench\\_%'")
                return databases + [row[0] for row in cursor.fetchall()]

    session, _ = client.start(0)
    assert len(leftovers()) == 2  # this episode's database and user
    response = client.http.post(f"{client.api}/cancel", headers={"session_id": session})
    assert response.status_code == 200
    # the worker drops them as the cancelled episode unwinds
    wait_until(lambda: leftovers() == [], timeout_s=20, what="the cancelled episode's database to be dropped")
