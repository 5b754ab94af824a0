"""The controller's in-memory tables, without HTTP."""

from __future__ import annotations

from agentrl_ext.env.controller import sessions as sessions_module
from agentrl_ext.env.controller.registry import WorkerRecord, WorkerRegistry
from agentrl_ext.env.controller.sessions import OpenSession, SessionTable
from agentrl_ext.env.protocol import HeartbeatRequest, SampleStatus


def worker(address: str = "http://127.0.0.1:1/api", concurrency: int = 100) -> WorkerRecord:
    return WorkerRecord(address, "t", concurrency, [0, 1], last_heartbeat=0.0, routable=True)


def test_idle_sessions_are_found_oldest_first_and_busy_ones_skipped():
    table = SessionTable(max_unreported=10, max_reported=10)
    w = worker()
    for sid, t in ((1, 0.0), (2, 1.0), (3, 2.0)):
        table.add(OpenSession(sid, "t", 0, w, t, t))
    table.open[1].busy = True
    table.touch(table.open[2], 10.0)
    assert [s.session_id for s in table.idle_since(5.0)] == [3]  # 1 is busy, 2 was touched


def test_unreported_endings_survive_many_normal_endings():
    table = SessionTable(max_unreported=5, max_reported=3)
    w = worker()
    table.add(OpenSession(1, "t", 0, w, 0.0, 0.0))
    table.end(1, SampleStatus.TASK_ERROR, "worker lost", reported=False, now=0.0)
    for sid in range(2, 50):
        table.add(OpenSession(sid, "t", 0, w, 0.0, 0.0))
        table.end(sid, SampleStatus.COMPLETED, None, reported=True, now=0.0)
    assert table.ended(1) is not None and table.ended(1).reason == "worker lost"
    assert len(table.reported) == 3 and table.ended(2) is None
    table.mark_reported(1)
    assert 1 not in table.unreported and table.ended(1).reported


def test_ended_records_expire():
    table = SessionTable(max_unreported=5, max_reported=5)
    w = worker()
    for sid, t in ((1, 1.0), (2, 5.0)):
        table.add(OpenSession(sid, "t", 0, w, 0.0, 0.0))
        table.end(sid, SampleStatus.COMPLETED, None, reported=True, now=t)
    table.forget_ended(cutoff=3.0)
    assert table.ended(1) is None and table.ended(2) is not None


def test_new_session_ids_are_random_positive_int64_never_reused(monkeypatch):
    table = SessionTable(10, 10)
    ids = [table.new_id() for _ in range(200)]
    assert all(isinstance(i, int) and 0 < i < 2**63 for i in ids) and len(set(ids)) == 200
    assert max(ids).bit_length() >= 60  # not a counter: the high bits are drawn too
    w = worker()
    table.add(OpenSession(ids[0], "t", 0, w, 0.0, 0.0))
    table.add(OpenSession(ids[1], "t", 0, w, 0.0, 0.0))
    table.end(ids[1], SampleStatus.COMPLETED, None, reported=True, now=0.0)
    drawn = iter([0, ids[0], ids[1], 12345])  # zero, an open id, a remembered id, a fresh one
    monkeypatch.setattr(sessions_module.secrets, "randbits", lambda bits: next(drawn))
    assert table.new_id() == 12345


def test_pick_prefers_most_free_and_skips_full_unroutable_and_excluded():
    registry = WorkerRegistry()
    a, b, c = worker("http://a", 4), worker("http://b", 8), worker("http://c", 16)
    b.sessions.update({1, 2, 3})  # 5 free
    c.routable = False
    for w in (a, b, c):
        registry.by_address[w.address] = w
    assert registry.pick("t", now=0.0, exclude=set()) is b
    assert registry.pick("t", now=0.0, exclude={"http://b"}) is a
    b.full_until = 10.0  # answered 406 recently
    assert registry.pick("t", now=1.0, exclude=set()) is a
    assert registry.pick("other", now=1.0, exclude=set()) is None


def test_heartbeat_rejoin_after_unhealthy_and_task_change():
    registry = WorkerRegistry()
    beat = HeartbeatRequest(name="t", address="http://w/api/", concurrency=2, indices=[0])
    record, joined = registry.heartbeat(beat, now=0.0)
    assert joined and record.address == "http://w/api"
    assert registry.heartbeat(beat, now=1.0) == (record, False)
    record.healthy = False
    assert registry.heartbeat(beat, now=2.0) == (record, True)
    moved, joined = registry.heartbeat(beat.model_copy(update={"name": "u"}), now=3.0)
    assert joined and moved is not record and moved.name == "u"
