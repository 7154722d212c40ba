"""The journal never loses tasks silently: after a SIGKILL, damage to its files (a deleted, truncated or garbled
``-wal``, a truncated main file, a lost or foreign sidecar, another schema) is either recovered in full or refused
with an error naming the file; ``reset_damaged`` moves the files aside instead. A full disk refuses the write (and
the goal, in the planner) without damaging what was journaled; a read-only or non-folder ``state_dir`` is named.

Pure Python except the last test (an in-process planner, rclpy)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from timelyllm_ros.planner.journal import (
    DB_NAME,
    SEQ_NAME,
    Journal,
    JournalDamagedError,
    JournalError,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 9  # tasks, as in the issue

# Accepts N tasks (each with one segment sent), optionally checkpointing after the first `ckpt` of them (so the
# main file holds data too), then dies by SIGKILL: what a killed planner leaves, most of it in the -wal.
CHILD = r"""
import os, signal, sys
from timelyllm_ros.planner.journal import Journal
j = Journal(sys.argv[1])
n, ckpt, clean = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "clean"
for k in range(n):
    j.task_accepted(f"t{k}", f"r{k % 3}", "drone", {"task": "fly to the window " * 12, "k": k}, float(k))
    j.segment_sent(f"t{k}", 0, f"MOVE {k}", [1, 2, k], False, k + 0.1, 0.5)
    if k + 1 == ckpt:
        j.checkpoint()
if clean:
    j.close()
    sys.exit(0)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _journal_left(state: Path, n: int = N, ckpt: int = 0, clean: bool = False) -> Path:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", CHILD, str(state), str(n), str(ckpt), "clean" if clean else "kill"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == (0 if clean else -signal.SIGKILL), r.stderr
    return state


def _files(state: Path) -> dict[str, str]:
    """Digest of every journal file but the -shm (SQLite rebuilds that index, a read-only open included)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(state.iterdir())
            if not p.name.endswith("-shm")}


def _assert_all_recovered(j: Journal, n: int = N) -> None:
    assert [t.task_id for t in j.unfinished()] == [f"t{k}" for k in range(n)]
    assert all([s.text for s in t.segments] == [f"MOVE {t.spec['k']}"] for t in j.unfinished())
    assert j.integrity_check() == "ok"


def _refused(state: Path, *words: str) -> JournalDamagedError:
    """Open must refuse, naming a file of ``state``, and leave every file as it found it (the evidence)."""
    before = _files(state)
    with pytest.raises(JournalDamagedError) as e:
        Journal(state)
    msg = str(e.value)
    assert str(state / DB_NAME) in msg or str(state / SEQ_NAME) in msg, msg
    for w in words:
        assert w in msg, msg
    after = _files(state)
    empty = hashlib.sha256(b"").hexdigest()  # the read-only check may leave an empty -wal where none was
    assert {k: v for k, v in after.items() if k in before or v != empty} == before
    return e.value


def _garble(path: Path, offset: int, n: int, seed: int = 1) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(random.Random(seed).randbytes(n))


def test_a_killed_journal_is_recovered_whole(tmp_path):
    state = _journal_left(tmp_path / "s")
    # the picture: the tasks sit in the -wal, the main file holds the schema only
    assert (state / (DB_NAME + "-wal")).stat().st_size > 4096 * N
    with Journal(state) as j:
        assert j.warnings == [] and j.reset_report is None
        _assert_all_recovered(j)


@pytest.mark.parametrize("fault", ["wal_deleted", "wal_and_shm_deleted", "wal_truncated", "wal_garbage",
                                   "wal_header_garbage", "main_empty", "main_deleted"])
def test_damage_to_a_killed_journal_is_refused_naming_the_file(tmp_path, fault):
    state = _journal_left(tmp_path / "s")
    db, wal, shm = state / DB_NAME, state / (DB_NAME + "-wal"), state / (DB_NAME + "-shm")
    if fault == "wal_deleted":
        wal.unlink()
    elif fault == "wal_and_shm_deleted":
        wal.unlink()
        shm.unlink()
    elif fault == "wal_truncated":
        os.truncate(wal, wal.stat().st_size // 2)
    elif fault == "wal_garbage":  # SQLite drops the frames from the first bad checksum on, silently
        _garble(wal, wal.stat().st_size // 2, 600)
    elif fault == "wal_header_garbage":  # ... or all of them
        _garble(wal, 8, 16)
    elif fault == "main_empty":
        os.truncate(db, 0)
    elif fault == "main_deleted":
        db.unlink()
    words = {"main_empty": ["empty"], "main_deleted": ["missing"]}.get(fault, ["lost"])
    _refused(state, *words)
    if fault.startswith("main"):
        assert wal.stat().st_size > 0  # SQLite would have deleted the -wal beside an empty main file


def test_a_truncated_or_garbled_main_file_is_refused(tmp_path):
    for cut in ("half", "header", "page"):
        state = _journal_left(tmp_path / cut, ckpt=N)  # everything checkpointed into the main file
        db = state / DB_NAME
        size = db.stat().st_size
        assert size > 4 * 4096
        if cut == "half":
            os.truncate(db, size // 2)
        elif cut == "header":
            _garble(db, 0, 16)
        else:
            for page in range(1, size // 4096):  # every page but the first: garbage wherever the rows are
                _garble(db, page * 4096 + 8, 64, seed=page)
        (state / (DB_NAME + "-wal")).unlink()  # what the main file lacks now cannot come from the -wal
        _refused(state)


def test_garbage_in_an_already_checkpointed_wal_loses_nothing(tmp_path):
    """Frames whose pages are in the main file already: full recovery, no false alarm."""
    state = _journal_left(tmp_path / "s", ckpt=N)
    wal = state / (DB_NAME + "-wal")
    _garble(wal, 32 + 24 + 100, 200)  # inside the first frame, copied into the main file by the checkpoint
    with Journal(state) as j:
        _assert_all_recovered(j)


def test_sidecar_faults(tmp_path):
    # missing after a kill: whether the -wal is whole cannot be told
    state = _journal_left(tmp_path / "killed")
    (state / SEQ_NAME).unlink()
    _refused(state, "not closed cleanly")
    # missing after a clean close: everything is in the main file; opened with a warning
    state = _journal_left(tmp_path / "clean", clean=True)
    assert not (state / (DB_NAME + "-wal")).exists()
    (state / SEQ_NAME).unlink()
    with Journal(state) as j:
        assert any("was missing" in w for w in j.warnings), j.warnings
        _assert_all_recovered(j)
    with Journal(state) as j:  # and written again
        assert j.warnings == []
    # another journal's sidecar, or garbage
    other = _journal_left(tmp_path / "other", n=20)
    shutil.copy(other / SEQ_NAME, state / SEQ_NAME)
    _refused(state, "another journal")
    (state / SEQ_NAME).write_bytes(b"12\n")
    _refused(state, "unreadable")


def test_schema_mismatch_and_foreign_database_are_refused(tmp_path):
    state = _journal_left(tmp_path / "s", clean=True)
    conn = sqlite3.connect(state / DB_NAME)
    conn.execute("ALTER TABLE segments ADD COLUMN extra TEXT")
    conn.close()
    _refused(state, "schema mismatch", "segments")
    other = tmp_path / "other"
    other.mkdir()
    conn = sqlite3.connect(other / DB_NAME)
    conn.execute("CREATE TABLE x (y)")
    conn.commit()
    conn.close()
    _refused(other, "not a task journal")


def test_a_journal_from_before_the_commit_counter_opens_with_a_warning(tmp_path):
    state = _journal_left(tmp_path / "s", clean=True)
    conn = sqlite3.connect(state / DB_NAME)
    conn.execute("DROP TABLE journal_meta")
    conn.close()
    (state / SEQ_NAME).unlink()
    with Journal(state) as j:
        assert any("predates loss detection" in w for w in j.warnings), j.warnings
        _assert_all_recovered(j)
        j.task_accepted("new", "r", "drone", {}, 99.0)
    with Journal(state) as j:  # counted from now on: an ordinary journal
        assert j.warnings == [] and j.status("new") == "active"


def test_reset_damaged_moves_the_files_aside_and_starts_empty(tmp_path):
    state = _journal_left(tmp_path / "s")
    (state / (DB_NAME + "-wal")).unlink()
    before = _files(state)
    with Journal(state, reset_damaged=True) as j:
        report = j.reset_report
        assert report is not None and "lost" in report and "moved" in report, report
        assert j.unfinished() == []
        j.task_accepted("fresh", "r", "drone", {}, 1.0)
    aside = sorted(p.name for p in state.iterdir() if ".damaged-" in p.name)
    stamp = aside[0].split(".damaged-")[1]
    assert {DB_NAME + ".damaged-" + stamp, DB_NAME + ".damaged-" + stamp + "-seq"} <= set(aside), aside
    for name in aside:
        assert str(state / name) in report
    moved = {n: (state / n).read_bytes() for n in aside if not n.endswith("-shm")}
    # renamed, byte for byte, nothing deleted (the -wal the check found missing is there again, empty)
    assert sorted(hashlib.sha256(b).hexdigest() for b in moved.values() if b) == sorted(before.values())
    with Journal(state) as j:  # the new journal is sound: no refusal, no reset
        assert j.reset_report is None and j.status("fresh") == "active"


def test_reset_is_not_for_a_newer_schema(tmp_path):
    from timelyllm_ros.planner.journal import SCHEMA_VERSION, JournalVersionError

    state = _journal_left(tmp_path / "s", clean=True)
    conn = sqlite3.connect(state / DB_NAME)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(JournalVersionError):
        Journal(state, reset_damaged=True)
    assert not [p for p in state.iterdir() if ".damaged-" in p.name]


# -- the storage under it -----------------------------------------------------------------------------------------

def test_state_dir_that_is_a_file_is_named(tmp_path):
    f = tmp_path / "state"
    f.write_text("x")
    with pytest.raises(JournalError, match=f"{f} is not a folder"):
        Journal(f)
    with pytest.raises(JournalError, match=f"cannot create the journal folder {f / 'sub'}"):
        Journal(f / "sub")


def _can_mount() -> str | None:
    """Why tmpfs mounts are not available here (None: they are)."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("mount") is None:
        return "no mount command"
    return None


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _remount(path: Path, opts: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{opts}", str(path)], check=True, capture_output=True)


def test_read_only_state_dir_is_named(tmp_path):
    """As root, permissions do not stop writes: a read-only tmpfs mount does. Otherwise a mode 0555 folder."""
    why = _can_mount()
    if why is None:
        ctx = _tmpfs(tmp_path / "ro", "4m")
    elif os.geteuid() != 0:
        ctx = contextlib.nullcontext(tmp_path / "ro")
        (tmp_path / "ro").mkdir()
    else:
        pytest.skip(f"root without tmpfs mounts ({why}): no way to make a folder read-only for this process")
    with ctx as ro:
        with Journal(ro / "state") as j:
            j.task_accepted("t0", "r", "drone", {}, 1.0)
        if why is None:
            _remount(ro, "ro")
        else:
            os.chmod(ro / "state", 0o555)
            os.chmod(ro, 0o555)
        try:
            with pytest.raises(JournalError, match=f"{ro / 'state'}.*(Read-only|ermission)") as e:
                Journal(ro / "state")
            assert not isinstance(e.value, JournalDamagedError)  # storage, not damage: reset would not help
            with pytest.raises(JournalError, match=f"cannot create the journal folder {ro / 'new'}"):
                Journal(ro / "new")
        finally:
            if why is None:
                _remount(ro, "rw")
            else:
                os.chmod(ro, 0o755)
                os.chmod(ro / "state", 0o755)
        with Journal(ro / "state") as j:  # nothing was harmed
            assert j.status("t0") == "active"


def _fill_until_full(j: Journal) -> tuple[list[str], JournalError]:
    accepted = []
    for k in range(100000):
        try:
            j.task_accepted(f"t{k}", "r", "drone", {"task": "x" * 3000, "k": k}, float(k))
        except JournalError as e:
            return accepted, e
        accepted.append(f"t{k}")
    raise AssertionError("the disk never filled")


def test_full_disk_refuses_the_write_and_keeps_what_was_journaled(tmp_path):
    """A real full disk (a 1 MiB tmpfs) where mounts are allowed; else SQLite's max_page_count, which fails
    writes with the same SQLITE_FULL ("database or disk is full")."""
    emulated = _can_mount() is not None
    ctx = contextlib.nullcontext(tmp_path) if emulated else _tmpfs(tmp_path / "small", "1m")
    with ctx as root:
        state = root / "state"
        j = Journal(state)
        if emulated:
            j.limit_pages(200)
        accepted, err = _fill_until_full(j)
        assert len(accepted) > 5
        assert str(state / DB_NAME) in str(err) and "full" in str(err), err
        assert not isinstance(err, JournalDamagedError)
        with pytest.raises(JournalError, match="full"):  # still full: every write refused, none half-done
            j.task_accepted("late", "r", "drone", {"task": "y" * 3000}, 0.0)
        assert j.status(accepted[-1]) == "active" and j.status("late") is None
        j.close()  # no clean close possible on a full disk: logged, and the next open checks the files
        if not emulated:
            _remount(root, "size=8m")
        with Journal(state) as j:  # everything that returned is there, nothing else, no damage
            assert [t.task_id for t in j.unfinished()] == accepted
            assert j.integrity_check() == "ok"
            j.task_accepted("after", "r", "drone", {}, 1.0)


# -- in the planner ------------------------------------------------------------------------------------------------

@pytest.mark.ros
def test_planner_refuses_a_damaged_journal_resets_on_request_and_refuses_goals_it_cannot_journal(tmp_path):
    rclpy = pytest.importorskip("rclpy")
    from rclpy.parameter import Parameter

    from timelyllm_ros.domain.types import TaskStatus
    from timelyllm_ros.msg import TimeUtility
    from timelyllm_ros.paths import config_dir
    from timelyllm_ros.planner.service_io import PlanRequest
    from timelyllm_ros.ros.convert import tuf_request
    from timelyllm_ros.ros.planner_node import GoalError, build_planner

    state = _journal_left(tmp_path / "s")
    (state / (DB_NAME + "-wal")).unlink()
    params = [Parameter("engine_config", value=str(config_dir() / "engine_sim.yaml")),
              Parameter("warm_up", value=False), Parameter("state_dir", value=str(state))]
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    try:
        with pytest.raises(RuntimeError, match=f"could not configure: .*{state / SEQ_NAME}.*lost"):
            build_planner(params, context=ctx)
        planner, sched = build_planner(params + [Parameter("journal_reset_damaged", value=True)], context=ctx)
        try:
            assert planner.journal.reset_report and planner.journal.unfinished() == []
            tuf = tuf_request(TimeUtility(level="normal"))
            planner.journal.limit_pages()  # SQLite's full disk, for this connection: no page beyond these
            task = "take off and fly to the window " * 40
            with pytest.raises(GoalError, match=f"{state / DB_NAME}.*full") as e:
                for k in range(200):
                    planner.service.accept(PlanRequest(f"g{k}", "drone_0", "drone", task, tuf))
            assert e.value.status is TaskStatus.BUSY
            refused = f"g{k}"
            assert refused not in planner.service.open_tasks() and planner.core.task_status(refused) is None
            assert planner.journal.status(refused) is None
            assert all(planner.journal.status(f"g{i}") == "active" for i in range(k))
            planner.journal.limit_pages(1_000_000)
            # space again
            assert planner.service.accept(PlanRequest(refused, "drone_0", "drone", task, tuf))[0] == refused
            assert planner.journal.status(refused) == "active"
        finally:
            planner.shutdown()
            planner.destroy_node()
            sched.destroy_node()
    finally:
        rclpy.try_shutdown(context=ctx)
