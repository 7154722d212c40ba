"""Durable journal of accepted tasks, so a planner killed with SIGKILL and restarted resumes every unfinished task.

The planner records each step of a task's life as it happens: the request as accepted, every segment handed
to the transport, the robot's acknowledgement and report of each segment, the end-of-plan marker and the
terminal result. Each public write commits before it returns, so whatever a caller saw return survives a kill
of the process. On restart :meth:`Journal.unfinished` gives the tasks to resume (with what was already sent),
:meth:`Journal.unacked` the segments to send again, and :meth:`Journal.result` answers clients asking about
tasks finished before the restart. :meth:`Journal.prune` keeps the file bounded for a planner running for weeks.

Durability and integrity (see :class:`Journal`): every commit is fsynced (WAL, ``synchronous=FULL``), a commit
counter is kept in the database and mirrored in a small sidecar file, and a journal that is damaged, or has lost
commits it is known to have made (a deleted, truncated or corrupted ``-wal``, a truncated or replaced main file), is
refused at open with :class:`JournalDamagedError` naming the file and the problem, never opened with tasks missing.

Pure Python (standard library ``sqlite3``); never imports rclpy.

Schema (``PRAGMA user_version`` = :data:`SCHEMA_VERSION`):

``tasks``
    ``seq`` (INTEGER PRIMARY KEY: acceptance order), ``task_id`` (TEXT UNIQUE), ``robot_id``, ``robot_type``,
    ``spec`` (JSON object), ``arrival_wall`` (REAL), ``status`` (``'active'`` until finished, then the terminal
    status), ``result`` (JSON object or NULL), ``finished_wall`` (REAL or NULL).
``segments``
    primary key ``(task_id, idx)``; ``text``, ``token_ids`` (JSON list), ``is_final``, ``marker`` (1 for an
    end-of-plan marker: text ``''``, is_final 1), ``dispatch_wall``, ``est_exec_s``, ``acked``, ``reported``,
    ``success`` (NULL until reported), ``start_wall``, ``finish_wall``, ``error``.
``journal_meta``
    one row: ``journal_id`` (random, also in the sidecar), ``commit_seq`` (+1 in every write transaction that
    changed a row), ``clean`` (1 only while closed cleanly: checkpointed, the ``-wal`` empty). Journals written
    before it existed get it on their first open (with a warning: what they lost before cannot be known).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from timelyllm_ros.planner.journal_files import (
    DB_NAME,
    SCHEMA,
    SCHEMA_VERSION,
    SEQ_NAME,
    JournalDamagedError,
    JournalError,
    JournalVersionError,
    check_files,
    move_aside,
    seq_record,
    sqlite_error,
)

__all__ = ["DB_NAME", "SEQ_NAME", "SCHEMA_VERSION", "ACTIVE", "Journal", "JournalDamagedError", "JournalError",
           "JournalVersionError", "JournaledSegment", "JournaledTask"]

ACTIVE = "active"  # status of a task accepted and not finished; reserved, never a terminal status

_log = logging.getLogger(__name__)
_SEG_COLS = (
    "s.idx, s.text, s.token_ids, s.is_final, s.marker, s.dispatch_wall, s.est_exec_s, "
    "s.acked, s.reported, s.success, s.start_wall, s.finish_wall, s.error"
)


@dataclass
class JournaledSegment:
    """One segment (or end-of-plan marker) as journaled; ``marker`` rows have text ``''`` and ``is_final``."""

    index: int
    text: str
    token_ids: list[int]
    is_final: bool
    marker: bool
    dispatch_wall: float | None
    est_exec_s: float
    acked: bool
    reported: bool
    success: bool | None
    start_wall: float | None
    finish_wall: float | None
    error: str


@dataclass
class JournaledTask:
    """A task as journaled (by ``unfinished``: accepted and not finished), with the segments already sent for it,
    in index order."""

    task_id: str
    robot_id: str
    robot_type: str
    spec: dict[str, Any]
    arrival_wall: float
    segments: list[JournaledSegment] = field(default_factory=list)


def _segment(row: tuple) -> JournaledSegment:
    (idx, text, tokens, is_final, marker, dispatch, est, acked, reported, success, start, finish, error) = row
    return JournaledSegment(
        index=idx,
        text=text,
        token_ids=json.loads(tokens),
        is_final=bool(is_final),
        marker=bool(marker),
        dispatch_wall=dispatch,
        est_exec_s=math.nan if est is None else est,  # SQLite stores NaN as NULL
        acked=bool(acked),
        reported=bool(reported),
        success=None if success is None else bool(success),
        start_wall=start,
        finish_wall=finish,
        error=error,
    )


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


class Journal:
    """SQLite journal in ``<path>/journal.sqlite3``, safe to share between threads (one process per journal).

    Durability: WAL with ``synchronous=FULL``. Every commit is fsynced before the call returns, so what returned
    (a goal's acceptance above all) survives a killed process and an OS crash or power loss alike; the price is
    one fsync per write (``python -m bench.journal_bench`` measures it). The WAL is checkpointed into the main file
    every 1000 pages (SQLite's ``wal_autocheckpoint``), after every :meth:`prune` (the planner prunes every 30 s),
    and at open and close (TRUNCATE: a cleanly closed journal is the main file alone), so the ``-wal`` stays small
    and the main file is about one prune period behind at most. ``synchronous="NORMAL"`` skips the per-commit
    fsync: a killed process still loses nothing, a power loss may roll back the commits since the last checkpoint.

    Loss detection: ``journal_meta.commit_seq`` counts write transactions, and after each commit (under NORMAL:
    after each complete checkpoint, when the commits up to it are on disk) that count is overwritten in place in
    the sidecar ``journal.sqlite3-seq`` (no fsync per commit: the page cache survives a killed process). The
    sidecar is never ahead of what the database holds durably, so a database with fewer commits than the sidecar
    records has lost some: a ``-wal`` deleted, truncated or with garbage in it (SQLite silently stops reading at
    the first bad frame), a main file truncated or replaced by an older copy. Open also refuses a main file that is
    not a database, is empty beside a ``-wal``, fails ``PRAGMA integrity_check`` or holds other columns than this
    schema; a sidecar unreadable or of another journal; and a missing sidecar unless the journal was closed
    cleanly. All with :class:`JournalDamagedError` naming the file and the problem; ``reset_damaged=True`` instead
    moves the damaged files aside (renamed ``journal.sqlite3.damaged-<time>[-wal|-shm|-seq]``, never deleted),
    starts an empty journal and says so in :attr:`reset_report`. The checks read through a read-only connection:
    a read-write one would checkpoint and delete the evidence (the ``-wal``) when it closes.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, synchronous: str = "FULL", reset_damaged: bool = False
    ) -> None:
        sync = synchronous.upper()
        if sync not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        self.dir = os.fspath(path)
        self.file = os.path.join(self.dir, DB_NAME)
        self.seq_file = os.path.join(self.dir, SEQ_NAME)
        self.warnings: list[str] = []  # opened, with something the caller should log
        self.reset_report: str | None = None  # what reset_damaged moved aside, and why
        self.seq_errors = 0  # sidecar writes that failed (logged); loss detection is weaker until the next one works
        self._seq_each_commit = sync == "FULL"
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._seq_fd: int | None = None
        self._journal_id = ""
        self._seq = 0
        try:
            self._prepare_dir()
            try:
                journal_id, self._seq = check_files(self.file, self.dir, self.seq_file, self._seq_fd, self.warnings)
            except JournalDamagedError as e:
                if not reset_damaged:
                    raise
                if self._seq_fd is not None:  # reopened on the fresh files
                    os.close(self._seq_fd)
                    self._seq_fd = None
                moved = move_aside(self.file)
                self._prepare_dir()
                self.reset_report = (f"{e} -- reset_damaged: moved {', '.join(moved)} aside (kept, not deleted) and "
                                     "started an empty journal; the tasks in those files are not resumed")
                journal_id = None
            self._open(sync, journal_id)
        except BaseException:
            self._abort()
            raise

    # -- opening and checking -------------------------------------------------------------------------------------

    def _sqlite_error(self, e: sqlite3.Error, doing: str) -> JournalError:
        return sqlite_error(self.file, self.dir, e, doing)

    def _prepare_dir(self) -> None:
        if os.path.lexists(self.dir) and not os.path.isdir(self.dir):
            raise JournalError(f"journal folder {self.dir} is not a folder (a file of that name exists)")
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as e:
            raise JournalError(f"cannot create the journal folder {self.dir}: {e.strerror or e}") from e
        try:  # also the first write into the folder: a read-only one is named here, not deep in SQLite
            self._seq_fd = os.open(self.seq_file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise JournalError(f"journal folder {self.dir} is not writable: {self.seq_file}: {e.strerror or e}") from e

    def _open(self, synchronous: str, journal_id: str | None) -> None:
        try:
            # isolation_level=None: autocommit; writes open their own BEGIN IMMEDIATE transaction (_tx).
            conn = self._conn = sqlite3.connect(self.file, check_same_thread=False, isolation_level=None,
                                                timeout=10.0)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise JournalError(f"journal {self.file}: could not switch to WAL mode (got {mode!r})")
            conn.execute(f"PRAGMA synchronous={synchronous}")
            self._journal_id = journal_id or uuid.uuid4().hex
            # The sidecar first (never ahead of the db), then clean=0 into the main file (TRUNCATE checkpoint): a
            # -wal lost from now on is caught by the count, or, should the sidecar go too, by clean=0.
            self._write_seq(durable=True)
            with self._tx(bump=False) as c:
                # not executescript: it would COMMIT this transaction before running the script
                for stmt in SCHEMA.split(";"):
                    if stmt.strip():
                        c.execute(stmt)
                c.execute(
                    "INSERT INTO journal_meta (id, journal_id, commit_seq, clean) VALUES (1, ?, ?, 0) "
                    "ON CONFLICT (id) DO UPDATE SET clean = 0",
                    (self._journal_id, self._seq),
                )
                c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            dfd = os.open(self.dir, os.O_RDONLY)  # the sidecar's and the db's names durable too
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except JournalError:
            raise
        except sqlite3.Error as e:
            raise self._sqlite_error(e, "open it for writing") from e
        except OSError as e:
            raise JournalError(f"journal {self.dir}: cannot open it for writing: {e.strerror or e}") from e

    def _write_seq(self, durable: bool = False) -> None:
        assert self._seq_fd is not None
        os.pwrite(self._seq_fd, seq_record(self._journal_id, self._seq), 0)
        if durable:
            os.fsync(self._seq_fd)

    def _note_seq(self, durable: bool = False) -> None:
        """Sidecar update after a commit: its failure is logged, never raised (the commit itself has happened)."""
        try:
            self._write_seq(durable)
        except OSError as e:
            self.seq_errors += 1
            _log.error("journal %s: could not update %s (%s): a -wal lost now would go unnoticed",
                       self.file, self.seq_file, e)

    def _abort(self) -> None:
        """Release everything after a failed open, touching no file (unlike close)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._seq_fd is not None:
            os.close(self._seq_fd)
            self._seq_fd = None

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    def limit_pages(self, pages: int | None = None) -> None:
        """Cap the database at ``pages`` SQLite pages (None: those it has now), as a full disk would: tests."""
        db = self._db()
        n = db.execute("PRAGMA page_count").fetchone()[0] if pages is None else pages
        db.execute(f"PRAGMA max_page_count = {int(n)}")

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise sqlite3.ProgrammingError(f"{getattr(self, 'file', '?')}: journal is closed")
        return self._conn

    @contextmanager
    def _tx(self, bump: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction under the lock: committed when the block ends, rolled back if it raises. One
        that changed a row counts in ``commit_seq`` (and the sidecar). A failure of the storage (disk full, I/O
        error, read-only) is raised as :class:`JournalError` naming the file."""
        with self._lock:
            conn = self._db()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise self._sqlite_error(e, "write") from e
            changes = conn.total_changes
            seq = None
            try:
                yield conn
                if bump and conn.total_changes != changes:
                    conn.execute("UPDATE journal_meta SET commit_seq = commit_seq + 1 WHERE id = 1")
                    seq = conn.execute("SELECT commit_seq FROM journal_meta WHERE id = 1").fetchone()[0]
                conn.execute("COMMIT")
            except BaseException as e:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # SQLite rolled back itself (e.g. a failed COMMIT on a full disk)
                if isinstance(e, sqlite3.Error) and not isinstance(e, (sqlite3.ProgrammingError,
                                                                      sqlite3.IntegrityError, JournalError)):
                    raise self._sqlite_error(e, "write") from e
                raise
            if seq is not None:
                self._seq = seq
                if self._seq_each_commit:
                    self._note_seq()

    def checkpoint(self, mode: str = "PASSIVE") -> bool:
        """Copy the ``-wal`` into the main file (``mode``: PASSIVE, FULL, RESTART or TRUNCATE); True when all of it
        was copied (a reader of an older snapshot can hold some back)."""
        if mode.upper() not in ("PASSIVE", "FULL", "RESTART", "TRUNCATE"):
            raise ValueError(f"unknown checkpoint mode {mode!r}")
        with self._lock:
            try:
                busy, frames, done = self._db().execute(f"PRAGMA wal_checkpoint({mode.upper()})").fetchone()
            except sqlite3.Error as e:
                raise self._sqlite_error(e, "checkpoint") from e
            complete = busy == 0 and frames == done
            if complete:  # under NORMAL the commits so far are on disk now: the sidecar may say so
                self._note_seq(durable=True)
            return complete

    # -- writes ---------------------------------------------------------------------------------------------------

    def task_accepted(
        self, task_id: str, robot_id: str, robot_type: str, spec: dict[str, Any], arrival_wall: float
    ) -> None:
        """Record a request as accepted, with everything needed to restart it (``spec`` must be JSON-able).

        Raises ValueError if ``task_id`` is already journaled and still active; a finished task of the same id is
        replaced (with its segments), since the id is being reused for a new request.
        """
        if not isinstance(spec, dict):
            raise TypeError(f"spec must be a dict, not {type(spec).__name__}")
        if math.isnan(arrival_wall):
            raise ValueError("arrival_wall must be a number, not NaN")
        spec_json = _dumps(spec)
        with self._tx() as c:
            row = c.execute("SELECT status FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            if row is not None:
                if row[0] == ACTIVE:
                    raise ValueError(f"task {task_id!r} is already journaled and still active")
                c.execute("DELETE FROM segments WHERE task_id = ?", (task_id,))
                c.execute("DELETE FROM tasks WHERE task_id = ?", (task_id,))
            c.execute(
                "INSERT INTO tasks (task_id, robot_id, robot_type, spec, arrival_wall) VALUES (?, ?, ?, ?, ?)",
                (task_id, robot_id, robot_type, spec_json, float(arrival_wall)),
            )

    def _insert_segment(
        self,
        task_id: str,
        index: int,
        text: str,
        token_ids: list[int],
        is_final: bool,
        marker: bool,
        dispatch_wall: float | None,
        est_exec_s: float,
    ) -> bool:
        tokens = _dumps([int(t) for t in token_ids])
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO segments (task_id, idx, text, token_ids, is_final, marker, dispatch_wall, est_exec_s) "
                "SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM tasks WHERE task_id = ?) "
                "ON CONFLICT (task_id, idx) DO NOTHING",
                (task_id, int(index), text, tokens, int(is_final), int(marker), dispatch_wall, est_exec_s, task_id),
            )
            if cur.rowcount == 1:
                return True
            row = c.execute("SELECT marker FROM segments WHERE task_id = ? AND idx = ?", (task_id, index)).fetchone()
            if row is None:
                raise KeyError(f"task {task_id!r} is not journaled")
            if bool(row[0]) != marker:
                kind = "an end marker" if row[0] else "a segment"
                raise ValueError(f"task {task_id!r} index {index} is already journaled as {kind}")
            return False

    def segment_sent(
        self,
        task_id: str,
        index: int,
        text: str,
        token_ids: list[int],
        is_final: bool,
        dispatch_wall: float,
        est_exec_s: float,
    ) -> bool:
        """Record a segment handed to the transport, so a restart knows what the robot may already have.

        Idempotent on ``(task_id, index)``: a re-send keeps the first row (and its ack/report state) and returns
        False; True when the row was new. Raises KeyError for a task never accepted (or pruned).
        """
        return self._insert_segment(task_id, index, text, token_ids, is_final, False, dispatch_wall, est_exec_s)

    def end_marker_sent(self, task_id: str, index: int, dispatch_wall: float | None = None) -> bool:
        """Record the end-of-plan marker (the plan ended after ``index - 1``) as a segment row with ``marker=1``.

        Idempotent like :meth:`segment_sent`; ValueError if ``index`` already holds an ordinary segment.
        """
        return self._insert_segment(task_id, index, "", [], True, True, dispatch_wall, 0.0)

    def segment_acked(self, task_id: str, index: int) -> bool:
        """Record that the robot acknowledged a segment (or marker): it need not be re-sent after a restart.

        Returns False when no such segment is journaled (e.g. a late ack for a pruned task); idempotent.
        """
        with self._tx() as c:
            cur = c.execute("UPDATE segments SET acked = 1 WHERE task_id = ? AND idx = ?", (task_id, int(index)))
            return cur.rowcount == 1

    end_marker_acked = segment_acked

    def segment_reported(
        self,
        task_id: str,
        index: int,
        success: bool,
        start_wall: float | None,
        finish_wall: float | None,
        error: str = "",
    ) -> bool:
        """Record the robot's report of a segment's execution; a report also counts as its acknowledgement.

        A later report overwrites an earlier one. Returns False when no such segment is journaled.
        """
        with self._tx() as c:
            cur = c.execute(
                "UPDATE segments SET acked = 1, reported = 1, success = ?, start_wall = ?, finish_wall = ?, "
                "error = ? WHERE task_id = ? AND idx = ?",
                (int(bool(success)), start_wall, finish_wall, error or "", task_id, int(index)),
            )
            return cur.rowcount == 1

    def task_finished(self, task_id: str, status: str, result: dict[str, Any], finished_wall: float) -> None:
        """Record a task's terminal status and the result a client needs (JSON-able dict).

        A later call overwrites status, result and time (e.g. DONE becomes ROBOT_FAILED when a robot failure
        arrives after generation ended). Raises KeyError for a task never accepted (or pruned).
        """
        if status == ACTIVE or not status:
            raise ValueError(f"{status!r} is not a terminal status")
        if not isinstance(result, dict):
            raise TypeError(f"result must be a dict, not {type(result).__name__}")
        result_json = _dumps(result)
        with self._tx() as c:
            cur = c.execute(
                "UPDATE tasks SET status = ?, result = ?, finished_wall = ? WHERE task_id = ?",
                (status, result_json, float(finished_wall), task_id),
            )
            if cur.rowcount != 1:
                raise KeyError(f"task {task_id!r} is not journaled")

    def prune(self, keep_finished_s: float, keep_finished_max: int, now_wall: float) -> int:
        """Delete old finished tasks (and their segments) so the journal stays bounded; returns how many.

        A finished task is deleted when it finished more than ``keep_finished_s`` before ``now_wall`` or is not
        among the ``keep_finished_max`` most recently finished ones, unless it still has an unacknowledged segment
        dispatched (a marker without a dispatch time counts from the task's finish) within the last
        ``keep_finished_s``: that segment may still be in flight and its ack must find it. Active tasks are never
        pruned (admission bounds them). So at most ``keep_finished_max`` finished tasks remain, plus those with a
        segment still unacknowledged that was dispatched within the last ``keep_finished_s``.
        """
        if keep_finished_s < 0 or keep_finished_max < 0:
            raise ValueError("keep_finished_s and keep_finished_max must be >= 0")
        cutoff = float(now_wall) - float(keep_finished_s)
        with self._tx() as c:
            ids = [
                r[0]
                for r in c.execute(
                    "WITH fin AS (SELECT task_id, finished_wall, "
                    "ROW_NUMBER() OVER (ORDER BY finished_wall DESC, seq DESC) AS rn FROM tasks WHERE status != ?) "
                    "SELECT task_id FROM fin WHERE (finished_wall < ? OR rn > ?) AND NOT EXISTS ("
                    "SELECT 1 FROM segments s WHERE s.task_id = fin.task_id AND s.acked = 0 "
                    "AND COALESCE(s.dispatch_wall, fin.finished_wall) >= ?)",
                    (ACTIVE, cutoff, int(keep_finished_max), cutoff),
                )
            ]
            c.executemany("DELETE FROM segments WHERE task_id = ?", [(i,) for i in ids])
            c.executemany("DELETE FROM tasks WHERE task_id = ?", [(i,) for i in ids])
        self.checkpoint()  # periodic (the planner prunes every 30 s): the main file catches up with the -wal
        return len(ids)

    # -- reads ----------------------------------------------------------------------------------------------------

    def unfinished(self) -> list[JournaledTask]:
        """Tasks accepted and not finished, oldest arrival first, each with its segments in index order."""
        return self.with_status(ACTIVE)

    def with_status(self, status: str) -> list[JournaledTask]:
        """Tasks of ``status`` (ACTIVE, or a terminal one), oldest arrival first, with their segments in order."""
        with self._lock:
            conn = self._db()
            tasks = [
                JournaledTask(tid, rid, rtype, json.loads(spec), arrival)
                for tid, rid, rtype, spec, arrival in conn.execute(
                    "SELECT task_id, robot_id, robot_type, spec, arrival_wall FROM tasks WHERE status = ? "
                    "ORDER BY arrival_wall, seq",
                    (status,),
                )
            ]
            by_id = {t.task_id: t for t in tasks}
            for row in conn.execute(
                f"SELECT s.task_id, {_SEG_COLS} FROM segments s JOIN tasks t ON t.task_id = s.task_id "
                "WHERE t.status = ? ORDER BY s.task_id, s.idx",
                (status,),
            ):
                by_id[row[0]].segments.append(_segment(row[1:]))
        return tasks

    def task(self, task_id: str) -> JournaledTask | None:
        """One task (active or finished) with its segments in index order; None if unknown or pruned."""
        with self._lock:
            conn = self._db()
            row = conn.execute(
                "SELECT task_id, robot_id, robot_type, spec, arrival_wall FROM tasks WHERE task_id = ?", (task_id,)
            ).fetchone()
            if row is None:
                return None
            t = JournaledTask(row[0], row[1], row[2], json.loads(row[3]), row[4])
            for seg in conn.execute(f"SELECT {_SEG_COLS} FROM segments s WHERE s.task_id = ? ORDER BY s.idx",
                                    (task_id,)):
                t.segments.append(_segment(seg))
        return t

    def unacked(self) -> list[tuple[str, str, JournaledSegment]]:
        """``(task_id, robot_id, segment)`` for every segment or marker not yet acknowledged, finished tasks too.

        Ordered by task arrival then index: the order to re-send them in after a restart.
        """
        with self._lock:
            rows = (
                self._db()
                .execute(
                    f"SELECT t.task_id, t.robot_id, {_SEG_COLS} FROM segments s JOIN tasks t ON t.task_id = s.task_id "
                    "WHERE s.acked = 0 ORDER BY t.arrival_wall, t.seq, s.idx"
                )
                .fetchall()
            )
        return [(r[0], r[1], _segment(r[2:])) for r in rows]

    def result(self, task_id: str) -> dict[str, Any] | None:
        """The terminal result of a finished task; None if it is active, unknown or pruned."""
        with self._lock:
            row = self._db().execute("SELECT result FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return None if row is None or row[0] is None else json.loads(row[0])

    def status(self, task_id: str) -> str | None:
        """``"active"``, the terminal status, or None for a task unknown (or pruned)."""
        with self._lock:
            row = self._db().execute("SELECT status FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return None if row is None else row[0]

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` verdict (``"ok"`` when sound); for diagnostics and tests."""
        with self._lock:
            rows = self._db().execute("PRAGMA integrity_check").fetchall()
        return "\n".join(str(r[0]) for r in rows)

    def close(self) -> None:
        """Close the database (idempotent); later calls raise ``sqlite3.ProgrammingError``.

        A clean close checkpoints everything into the main file, empties the ``-wal`` and marks the journal clean
        (the only state in which a missing sidecar is accepted at the next open). Failing that (disk full, a
        reader holding the -wal) it just closes: the next open checks the files as they are.
        """
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                try:
                    if conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0:
                        conn.execute("UPDATE journal_meta SET clean = 1 WHERE id = 1")
                        if conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0:
                            self._write_seq(durable=True)
                except (sqlite3.Error, OSError) as e:
                    _log.warning("journal %s: no clean close (%s); the next open checks it as it is", self.file, e)
                conn.close()
            if self._seq_fd is not None:
                os.close(self._seq_fd)
                self._seq_fd = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
