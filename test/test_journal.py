"""Durable task journal: round trips, idempotence, pruning, schema versions, and survival of a SIGKILL."""

import math
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timelyllm_ros.planner.journal import (
    DB_NAME,
    SCHEMA_VERSION,
    Journal,
    JournaledSegment,
    JournalVersionError,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SPEC = {
    "task": "go to the kitchen and pick up the cup",
    "tuf": {"alpha": 1.0, "beta": 0.5, "ert": 0.2, "level": "urgent"},
    "send_stamp": 1700000000.25,
    "extras": {"plan": "MOVE kitchen\nPICK cup", "max_tokens": 256},
}


@pytest.fixture
def journal(tmp_path):
    j = Journal(tmp_path / "state")
    yield j
    j.close()


def test_creates_directory_wal_and_version(tmp_path):
    d = tmp_path / "a" / "b"
    with Journal(d) as j:
        assert j.file == str(d / DB_NAME)
        assert j.integrity_check() == "ok"
    conn = sqlite3.connect(d / DB_NAME)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_task_round_trip(journal):
    journal.task_accepted("t1", "r1", "tello", SPEC, 10.5)
    assert journal.status("t1") == "active"
    assert journal.result("t1") is None
    [t] = journal.unfinished()
    assert (t.task_id, t.robot_id, t.robot_type, t.spec, t.arrival_wall, t.segments) == (
        "t1",
        "r1",
        "tello",
        SPEC,
        10.5,
        [],
    )
    assert journal.status("nope") is None and journal.result("nope") is None


def test_duplicate_open_task_refused(journal):
    journal.task_accepted("t1", "r1", "tello", SPEC, 1.0)
    with pytest.raises(ValueError, match="t1"):
        journal.task_accepted("t1", "r2", "tello", {}, 2.0)
    [t] = journal.unfinished()
    assert t.robot_id == "r1"


def test_finished_task_id_can_be_reused(journal):
    journal.task_accepted("t1", "r1", "tello", SPEC, 1.0)
    journal.segment_sent("t1", 0, "MOVE", [1], False, 1.1, 0.5)
    journal.task_finished("t1", "DONE", {"status": "DONE"}, 2.0)
    journal.task_accepted("t1", "r2", "turtle", {"task": "again"}, 3.0)
    [t] = journal.unfinished()
    assert (t.robot_id, t.spec, t.segments) == ("r2", {"task": "again"}, [])
    assert journal.status("t1") == "active" and journal.result("t1") is None
    assert journal.unacked() == []


def test_bad_arguments(journal):
    with pytest.raises(TypeError):
        journal.task_accepted("t1", "r1", "tello", ["not", "a", "dict"], 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        journal.task_accepted("t1", "r1", "tello", {"x": object()}, 1.0)
    with pytest.raises(ValueError):
        journal.task_accepted("t1", "r1", "tello", {}, math.nan)
    assert journal.unfinished() == []  # nothing half-written
    journal.task_accepted("t1", "r1", "tello", {}, 1.0)
    with pytest.raises(ValueError):
        journal.task_finished("t1", "active", {}, 2.0)
    with pytest.raises(KeyError):
        journal.task_finished("nope", "DONE", {}, 2.0)
    with pytest.raises(KeyError):
        journal.segment_sent("nope", 0, "x", [], False, 1.0, 0.1)
    with pytest.raises(ValueError):
        journal.prune(-1, 10, 0.0)


def test_segment_round_trip_and_idempotence(journal):
    journal.task_accepted("t1", "r1", "tello", SPEC, 1.0)
    assert journal.segment_sent("t1", 1, "PICK cup", [7, 8], True, 1.3, 0.7)
    assert journal.segment_sent("t1", 0, "MOVE kitchen", [4, 5, 6], False, 1.2, 2.5)
    # a re-send with different data keeps the first row
    assert not journal.segment_sent("t1", 0, "MOVE elsewhere", [9], True, 9.9, 9.9)
    assert journal.segment_acked("t1", 0)
    assert journal.segment_acked("t1", 0)  # idempotent
    assert not journal.segment_sent("t1", 0, "MOVE kitchen", [4, 5, 6], False, 1.2, 2.5)  # keeps the ack too
    assert journal.segment_reported("t1", 0, True, 1.25, 3.5, "")
    assert journal.segment_reported("t1", 1, False, 3.6, None, "gripper jammed")
    [t] = journal.unfinished()
    assert t.segments == [
        JournaledSegment(0, "MOVE kitchen", [4, 5, 6], False, False, 1.2, 2.5, True, True, True, 1.25, 3.5, ""),
        JournaledSegment(1, "PICK cup", [7, 8], True, False, 1.3, 0.7, True, True, False, 3.6, None, "gripper jammed"),
    ]
    conn = sqlite3.connect(journal.file)
    assert conn.execute("SELECT COUNT(*) FROM segments").fetchone()[0] == 2
    conn.close()
    assert not journal.segment_acked("t1", 5)
    assert not journal.segment_acked("nope", 0)
    assert not journal.segment_reported("nope", 0, True, None, None)


def test_nan_estimate_survives(journal):
    journal.task_accepted("t1", "r1", "tello", {}, 1.0)
    journal.segment_sent("t1", 0, "x", [], False, 1.0, math.nan)
    assert math.isnan(journal.unfinished()[0].segments[0].est_exec_s)


def test_end_marker(journal):
    journal.task_accepted("t1", "r1", "tello", SPEC, 1.0)
    journal.segment_sent("t1", 0, "MOVE", [1], False, 1.1, 0.5)
    assert journal.end_marker_sent("t1", 1, 1.4)
    assert not journal.end_marker_sent("t1", 1, 1.5)  # idempotent
    with pytest.raises(ValueError, match="end marker"):
        journal.segment_sent("t1", 1, "MORE", [2], True, 1.6, 0.1)
    with pytest.raises(ValueError, match="segment"):
        journal.end_marker_sent("t1", 0)
    [_, m] = journal.unfinished()[0].segments
    assert (m.index, m.marker, m.text, m.token_ids, m.is_final, m.dispatch_wall, m.acked) == (
        1,
        True,
        "",
        [],
        True,
        1.4,
        False,
    )
    assert [(tid, s.index, s.marker) for tid, _, s in journal.unacked()] == [("t1", 0, False), ("t1", 1, True)]
    assert journal.end_marker_acked("t1", 1)
    assert [(tid, s.index) for tid, _, s in journal.unacked()] == [("t1", 0)]


def test_finish_and_overwrite(journal):
    journal.task_accepted("t1", "r1", "tello", SPEC, 1.0)
    journal.segment_sent("t1", 0, "MOVE", [1], True, 1.1, 0.5)
    res = {"status": "DONE", "message": "", "plan": "MOVE", "response_time": 0.12, "utility": 0.9}
    journal.task_finished("t1", "DONE", res, 2.0)
    assert journal.status("t1") == "DONE" and journal.result("t1") == res
    assert journal.unfinished() == []
    # the last segment is still in flight: a finished task's unacked segments are listed
    [(tid, rid, seg)] = journal.unacked()
    assert (tid, rid, seg.index) == ("t1", "r1", 0)
    # the robot fails it after generation ended: the result is overwritten
    journal.segment_reported("t1", 0, False, 2.1, 2.2, "crashed")
    failed = dict(res, status="ROBOT_FAILED", message="crashed")
    journal.task_finished("t1", "ROBOT_FAILED", failed, 2.3)
    assert journal.status("t1") == "ROBOT_FAILED" and journal.result("t1") == failed
    assert journal.unacked() == []
    # a finished task is still read whole: its robot type and the segments sent (for /get_plan_result)
    t = journal.task("t1")
    assert (t.robot_id, t.robot_type, t.spec) == ("r1", "tello", SPEC)
    assert [(g.index, g.text, g.reported, g.success) for g in t.segments] == [(0, "MOVE", True, False)]
    assert journal.task("nope") is None


def test_unfinished_oldest_first_and_unacked_order(journal):
    journal.task_accepted("late", "r1", "tello", {}, 5.0)
    journal.task_accepted("early", "r2", "tello", {}, 1.0)
    journal.task_accepted("tie", "r3", "tello", {}, 5.0)
    for tid in ("late", "early", "tie"):
        journal.segment_sent(tid, 1, "b", [], False, 6.0, 0.1)
        journal.segment_sent(tid, 0, "a", [], False, 6.0, 0.1)
    assert [t.task_id for t in journal.unfinished()] == ["early", "late", "tie"]
    assert [[s.index for s in t.segments] for t in journal.unfinished()] == [[0, 1]] * 3
    assert [(tid, rid, s.index) for tid, rid, s in journal.unacked()] == [
        ("early", "r2", 0),
        ("early", "r2", 1),
        ("late", "r1", 0),
        ("late", "r1", 1),
        ("tie", "r3", 0),
        ("tie", "r3", 1),
    ]


def test_survives_reopen(tmp_path):
    with Journal(tmp_path) as j:
        j.task_accepted("t1", "r1", "tello", SPEC, 1.0)
        j.segment_sent("t1", 0, "MOVE", [1, 2], False, 1.1, 0.5)
        j.task_accepted("t2", "r2", "tello", {}, 2.0)
        j.task_finished("t2", "DONE", {"ok": True}, 3.0)
        before = (j.unfinished(), j.unacked())
    with Journal(tmp_path) as j:
        assert (j.unfinished(), j.unacked()) == before
        assert j.result("t2") == {"ok": True}


def test_closed_journal_raises(tmp_path):
    j = Journal(tmp_path)
    j.close()
    j.close()
    with pytest.raises(sqlite3.ProgrammingError):
        j.status("t1")


def test_newer_schema_refused(tmp_path):
    Journal(tmp_path).close()
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(JournalVersionError) as e:
        Journal(tmp_path)
    assert str(tmp_path / DB_NAME) in str(e.value)
    assert str(SCHEMA_VERSION + 1) in str(e.value)


def test_garbage_file_refused_with_path(tmp_path):
    (tmp_path / DB_NAME).write_bytes(b"this is not a database" * 100)
    with pytest.raises(sqlite3.DatabaseError) as e:
        Journal(tmp_path)
    assert str(tmp_path / DB_NAME) in str(e.value)


def _finished(j, tid, finished_wall, unacked_at=None):
    j.task_accepted(tid, "r", "tello", {}, finished_wall - 1)
    j.segment_sent(tid, 0, "x", [], True, finished_wall - 0.5, 0.1)
    j.segment_acked(tid, 0)
    if unacked_at is not None:
        j.end_marker_sent(tid, 1, unacked_at)
    j.task_finished(tid, "DONE", {"tid": tid}, finished_wall)


def test_prune_by_age_and_count(journal):
    for i in range(10):
        _finished(journal, f"f{i}", 100.0 + i)
    journal.task_accepted("active", "r", "tello", {}, 0.0)  # the oldest of all, never pruned
    assert journal.prune(keep_finished_s=1e9, keep_finished_max=10, now_wall=200.0) == 0
    # by age: finished before 200 - 95 = 105 -> f0..f4
    assert journal.prune(keep_finished_s=95.0, keep_finished_max=100, now_wall=200.0) == 5
    assert [journal.status(f"f{i}") for i in range(5)] == [None] * 5
    # by count: keep the 2 newest finished
    assert journal.prune(keep_finished_s=1e9, keep_finished_max=2, now_wall=200.0) == 3
    assert [i for i in range(10) if journal.status(f"f{i}")] == [8, 9]
    assert journal.status("active") == "active"
    assert journal.prune(keep_finished_s=0.0, keep_finished_max=0, now_wall=1e6) == 2
    assert [t.task_id for t in journal.unfinished()] == ["active"]
    conn = sqlite3.connect(journal.file)
    assert conn.execute("SELECT COUNT(*) FROM segments").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM tasks").fetchone()[0] == 1
    conn.close()


def test_prune_keeps_recent_in_flight(journal):
    _finished(journal, "flying", 100.0, unacked_at=150.0)  # marker sent at 150, not acked
    _finished(journal, "lost", 100.0, unacked_at=100.0)  # marker sent at 100, robot gone
    _finished(journal, "done", 100.0)
    # window 60 s at 200: everything finished before 140 -> only the recent in-flight one stays
    assert journal.prune(keep_finished_s=60.0, keep_finished_max=0, now_wall=200.0) == 2
    assert (journal.status("flying"), journal.status("lost"), journal.status("done")) == ("DONE", None, None)
    assert [tid for tid, _, _ in journal.unacked()] == ["flying"]
    # once the in-flight segment ages out it goes too
    assert journal.prune(keep_finished_s=60.0, keep_finished_max=0, now_wall=211.0) == 1
    assert journal.unacked() == []


def test_prune_bounds_a_long_run(journal):
    """A planner running for long: the journal never holds more than the bound (all tasks acked here)."""
    for i in range(300):
        _finished(journal, f"t{i}", float(i))
        if i % 10 == 9:
            journal.prune(keep_finished_s=1e9, keep_finished_max=25, now_wall=float(i))
            conn = sqlite3.connect(journal.file)
            assert conn.execute("SELECT COUNT(*) FROM tasks").fetchone()[0] == min(i + 1, 25)
            conn.close()
    assert journal.status("t299") == "DONE" and journal.status("t274") is None


def test_threads_share_one_journal(journal):
    def worker(w):
        for k in range(40):
            tid = f"w{w}-{k}"
            journal.task_accepted(tid, f"r{w}", "tello", {"k": k}, float(k))
            for i in range(3):
                journal.segment_sent(tid, i, f"s{i}", [i], i == 2, float(k), 0.1)
                journal.segment_acked(tid, i)
            if k % 2:
                journal.task_finished(tid, "DONE", {}, float(k) + 0.5)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(journal.unfinished()) == 6 * 20
    assert all(len(t.segments) == 3 for t in journal.unfinished())
    assert journal.unacked() == []
    assert journal.integrity_check() == "ok"


def test_timing_1000_segment_sent(tmp_path):
    """Not a timed assertion: prints what 1000 committed segment_sent calls cost here (run with -s to see it)."""
    for sync in ("NORMAL", "FULL"):
        with Journal(tmp_path / sync, synchronous=sync) as j:
            j.task_accepted("t", "r", "tello", SPEC, 0.0)
            tokens = list(range(20))
            t0 = time.perf_counter()
            for i in range(1000):
                j.segment_sent("t", i, "MOVE kitchen then PICK cup", tokens, False, 1.0, 0.5)
            dt = time.perf_counter() - t0
            assert len(j.unfinished()[0].segments) == 1000
        print(f"\n1000 segment_sent, synchronous={sync}: {dt * 1e3:.1f} ms ({dt * 1e3:.1f} us/call)")


# -- random interleavings against a model ------------------------------------------------------------------------

TIDS = ["a", "b", "c"]
op_st = st.one_of(
    st.tuples(st.just("accept"), st.sampled_from(TIDS)),
    st.tuples(st.just("sent"), st.sampled_from(TIDS), st.integers(0, 3)),
    st.tuples(st.just("marker"), st.sampled_from(TIDS), st.integers(0, 3)),
    st.tuples(st.just("acked"), st.sampled_from(TIDS), st.integers(0, 3)),
    st.tuples(st.just("reported"), st.sampled_from(TIDS), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("finished"), st.sampled_from(TIDS), st.sampled_from(["DONE", "ROBOT_FAILED"])),
    st.tuples(st.just("prune"), st.integers(0, 10), st.integers(0, 3)),
    st.tuples(st.just("reopen")),
)


class Model:
    """The journal's documented behaviour, in plain Python."""

    def __init__(self):
        self.tasks = {}
        self.seq = 0

    def apply(self, j, op, now):
        kind, *a = op
        if kind == "accept":
            (tid,) = a
            t = self.tasks.get(tid)
            if t is not None and t["status"] == "active":
                with pytest.raises(ValueError):
                    j.task_accepted(tid, "r-" + tid, "tello", {"n": now}, now)
                return
            j.task_accepted(tid, "r-" + tid, "tello", {"n": now}, now)
            self.seq += 1
            self.tasks[tid] = {"status": "active", "seq": self.seq, "arrival": now, "fin": None, "segs": {}}
        elif kind in ("sent", "marker"):
            tid, idx = a
            marker = kind == "marker"
            t = self.tasks.get(tid)
            call = (
                (lambda: j.end_marker_sent(tid, idx, now))
                if marker
                else (lambda: j.segment_sent(tid, idx, f"{tid}{idx}", [idx, idx], idx == 3, now, 0.5))
            )
            if t is None:
                with pytest.raises(KeyError):
                    call()
            elif idx in t["segs"] and t["segs"][idx]["marker"] != marker:
                with pytest.raises(ValueError):
                    call()
            else:
                assert call() == (idx not in t["segs"])
                t["segs"].setdefault(idx, {"marker": marker, "dispatch": now, "acked": False, "success": None})
        elif kind == "acked":
            tid, idx = a
            seg = self.tasks.get(tid, {"segs": {}})["segs"].get(idx)
            assert j.segment_acked(tid, idx) == (seg is not None)
            if seg:
                seg["acked"] = True
        elif kind == "reported":
            tid, idx, ok = a
            seg = self.tasks.get(tid, {"segs": {}})["segs"].get(idx)
            assert j.segment_reported(tid, idx, ok, now, now + 1, "" if ok else "failed") == (seg is not None)
            if seg:
                seg["acked"], seg["success"] = True, ok
        elif kind == "finished":
            tid, status = a
            if tid not in self.tasks:
                with pytest.raises(KeyError):
                    j.task_finished(tid, status, {"s": status, "at": now}, now)
                return
            j.task_finished(tid, status, {"s": status, "at": now}, now)
            self.tasks[tid].update(status=status, fin=now)
        elif kind == "prune":
            keep_s, keep_max = a
            cut = now - keep_s
            fin = sorted((t["fin"], t["seq"], tid) for tid, t in self.tasks.items() if t["status"] != "active")[::-1]
            gone = [
                tid
                for rank, (f, _, tid) in enumerate(fin, 1)
                if (f < cut or rank > keep_max)
                and not any(
                    not s["acked"] and (s["dispatch"] if s["dispatch"] is not None else f) >= cut
                    for s in self.tasks[tid]["segs"].values()
                )
            ]
            assert j.prune(keep_s, keep_max, now) == len(gone)
            for tid in gone:
                del self.tasks[tid]

    def check(self, j):
        active = sorted((t["arrival"], t["seq"], tid) for tid, t in self.tasks.items() if t["status"] == "active")
        got = j.unfinished()
        assert [t.task_id for t in got] == [tid for _, _, tid in active]
        for t in got:
            segs = self.tasks[t.task_id]["segs"]
            assert [s.index for s in t.segments] == sorted(segs)
            for s in t.segments:
                m = segs[s.index]
                assert (s.marker, s.acked, s.success, s.dispatch_wall) == (
                    m["marker"],
                    m["acked"],
                    m["success"],
                    m["dispatch"],
                )
                assert s.reported == (m["success"] is not None)
                assert s.text == ("" if m["marker"] else f"{t.task_id}{s.index}")
        order = sorted((t["arrival"], t["seq"], tid) for tid, t in self.tasks.items())
        want = [
            (tid, idx, seg["marker"])
            for _, _, tid in order
            for idx, seg in sorted(self.tasks[tid]["segs"].items())
            if not seg["acked"]
        ]
        assert [(tid, s.index, s.marker) for tid, _, s in j.unacked()] == want
        assert all(rid == "r-" + tid for tid, rid, _ in j.unacked())
        for tid in TIDS:
            t = self.tasks.get(tid)
            assert j.status(tid) == (t and t["status"])
            if t is None or t["status"] == "active":
                assert j.result(tid) is None
            else:
                assert j.result(tid) == {"s": t["status"], "at": t["fin"]}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op_st, max_size=40))
def test_random_interleavings_match_model(ops):
    with tempfile.TemporaryDirectory() as d:
        j = Journal(d)
        model = Model()
        try:
            for step, op in enumerate(ops):
                if op[0] == "reopen":
                    j.close()
                    j = Journal(d)
                else:
                    model.apply(j, op, float(step))
                model.check(j)
            assert j.integrity_check() == "ok"
        finally:
            j.close()


# -- crash test: SIGKILL a writer mid-way ------------------------------------------------------------------------

# Deterministic call stream shared by the child (which executes it) and the parent (which replays prefixes).
OPS_SRC = r"""
def ops():
    k = 0
    while True:
        tid, prev = f"t{k % 60}", f"t{(k - 1) % 60}"
        spec = {"task": f"task {k}", "k": k, "plan": "MOVE\nPICK"}
        yield "task_accepted", (tid, f"r{k % 5}", "tello", spec, float(k))
        for i in range(3):
            yield "segment_sent", (tid, i, f"seg {k}.{i}", list(range(i + 3)), i == 2, k + 0.1 * i, 0.5 + i)
        if k > 0:
            yield "end_marker_sent", (prev, 3, k + 0.05)
            yield "task_finished", (prev, "DONE", {"status": "DONE", "k": k - 1, "utility": 0.5}, k + 0.06)
        yield "segment_acked", (tid, 0)
        yield "segment_reported", (tid, 0, True, k + 0.2, k + 0.3, "")
        yield "segment_acked", (tid, 1)
        if k > 0:
            yield "segment_reported", (prev, 2, k % 3 != 0, k + 0.07, k + 0.08, "" if k % 3 else "boom")
            if k % 3 == 0:
                yield "task_finished", (prev, "ROBOT_FAILED", {"status": "ROBOT_FAILED", "k": k - 1}, k + 0.09)
        if k % 7 == 6:
            yield "prune", (4.0, 20, float(k))
        k += 1
"""

CHILD_SRC = (
    "import sys\n"
    "from timelyllm_ros.planner.journal import Journal\n" + OPS_SRC + "j = Journal(sys.argv[1])\n"
    "print('open', flush=True)\n"
    "for n, (name, args) in enumerate(ops()):\n"
    "    getattr(j, name)(*args)\n"
    "    print(n, flush=True)\n"
)


def _ops():
    ns = {}
    exec(OPS_SRC, ns)
    return ns["ops"]()


def _snapshot(path):
    """Every row of the journal (without internal row numbers), read with plain sqlite3."""
    conn = sqlite3.connect(os.path.join(path, DB_NAME))
    try:
        tasks = conn.execute(
            "SELECT task_id, robot_id, robot_type, spec, arrival_wall, status, result, finished_wall "
            "FROM tasks ORDER BY task_id"
        ).fetchall()
        segs = conn.execute("SELECT * FROM segments ORDER BY task_id, idx").fetchall()
        orphans = conn.execute(
            "SELECT COUNT(*) FROM segments WHERE task_id NOT IN (SELECT task_id FROM tasks)"
        ).fetchone()[0]
    finally:
        conn.close()
    assert orphans == 0
    return tasks, segs


def _replay(path, n):
    """The journal as it is after the first ``n`` calls of the stream."""
    with Journal(path) as j:
        for _, (name, args) in zip(range(n), _ops(), strict=False):
            getattr(j, name)(*args)
    return _snapshot(path)


@pytest.mark.parametrize("kill_after", [1, 37, 400, 1500])
def test_sigkill_mid_way_loses_nothing_returned(tmp_path, kill_after):
    state = tmp_path / "state"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_SRC, str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines = []
    try:
        while len(lines) < kill_after + 1:  # "open" plus kill_after returned calls
            line = child.stdout.readline()
            assert line, f"child exited early: {child.stderr.read()}"
            lines.append(line.strip())
        os.kill(child.pid, signal.SIGKILL)  # the child keeps writing until the signal lands
        child.wait(timeout=30)
        lines += [x.strip() for x in child.stdout.read().splitlines()]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    assert lines[0] == "open"
    returned = [int(x) for x in lines[1:] if x]
    assert returned == list(range(len(returned)))  # calls are sequential
    m = len(returned)
    assert m >= kill_after
    print(f"\nkilled after {m} returned calls")

    with Journal(state) as j:
        assert j.integrity_check() == "ok"
        j.unfinished(), j.unacked()  # readable
    got = _snapshot(state)
    # every call reported returned is in; the one in flight at the kill is either wholly in or wholly out
    assert got in (_replay(tmp_path / "exp0", m), _replay(tmp_path / "exp1", m + 1))
    assert got[0], "the child had journaled tasks"
