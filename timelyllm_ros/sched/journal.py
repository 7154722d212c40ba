"""Durable journal of accepted tasks, so a planner killed with SIGKILL and restarted resumes every unfinished task.

The planner records each step of a task's life as it happens: the request as accepted, every segment handed
to the transport, the robot's acknowledgement and report of each segment, the end-of-plan marker and the
terminal result. Each public write commits before it returns, so whatever a caller saw return survives a kill
of the process. On restart :meth:`Journal.unfinished` gives the tasks to resume (with what was already sent),
:meth:`Journal.unacked` the segments to send again, and :meth:`Journal.result` answers clients asking about
tasks finished before the restart. :meth:`Journal.prune` keeps the file bounded for a planner running for weeks.

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
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DB_NAME",
    "SCHEMA_VERSION",
    "ACTIVE",
    "Journal",
    "JournalVersionError",
    "JournaledSegment",
    "JournaledTask",
]

DB_NAME = "journal.sqlite3"
SCHEMA_VERSION = 1
ACTIVE = "active"  # status of a task accepted and not finished; reserved, never a terminal status

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    seq           INTEGER PRIMARY KEY,
    task_id       TEXT    NOT NULL UNIQUE,
    robot_id      TEXT    NOT NULL,
    robot_type    TEXT    NOT NULL,
    spec          TEXT    NOT NULL,
    arrival_wall  REAL    NOT NULL,
    status        TEXT    NOT NULL DEFAULT 'active',
    result        TEXT,
    finished_wall REAL
);
CREATE INDEX IF NOT EXISTS tasks_by_status ON tasks (status, finished_wall);
CREATE TABLE IF NOT EXISTS segments (
    task_id       TEXT    NOT NULL,
    idx           INTEGER NOT NULL,
    text          TEXT    NOT NULL,
    token_ids     TEXT    NOT NULL,
    is_final      INTEGER NOT NULL,
    marker        INTEGER NOT NULL DEFAULT 0,
    dispatch_wall REAL,
    est_exec_s    REAL,
    acked         INTEGER NOT NULL DEFAULT 0,
    reported      INTEGER NOT NULL DEFAULT 0,
    success       INTEGER,
    start_wall    REAL,
    finish_wall   REAL,
    error         TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (task_id, idx)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS segments_unacked ON segments (task_id, idx) WHERE acked = 0;
"""

_SEG_COLS = (
    "s.idx, s.text, s.token_ids, s.is_final, s.marker, s.dispatch_wall, s.est_exec_s, "
    "s.acked, s.reported, s.success, s.start_wall, s.finish_wall, s.error"
)


class JournalVersionError(RuntimeError):
    """The journal file was written by a newer (or unknown) schema; refusing it rather than misreading it."""


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
    """SQLite journal in ``<path>/journal.sqlite3``, safe to share between threads.

    Durability: WAL mode with ``synchronous=NORMAL``. A commit is appended to the WAL file (in the OS page cache)
    before the call returns, so a killed process (SIGKILL, crash, OOM kill) loses nothing that returned; only an
    OS crash or power loss may roll back the last few commits, which is acceptable for a planner (pass
    ``synchronous="FULL"`` to fsync every commit when that matters more than the ~10x write cost).
    """

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "NORMAL") -> None:
        if synchronous.upper() not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        os.makedirs(path, exist_ok=True)
        self.file = os.path.join(os.fspath(path), DB_NAME)
        self._lock = threading.RLock()
        # isolation_level=None: autocommit; multi-statement writes open their own BEGIN IMMEDIATE transaction.
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            self.file, check_same_thread=False, isolation_level=None, timeout=10.0
        )
        try:
            self._open(synchronous.upper())
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    def _open(self, synchronous: str) -> None:
        conn = self._db()
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as e:
            raise sqlite3.DatabaseError(f"{self.file}: not a usable journal database ({e})") from e
        if version != 0 and version != SCHEMA_VERSION:
            raise JournalVersionError(
                f"{self.file}: journal schema version {version} is not the supported version {SCHEMA_VERSION} "
                "(written by a newer planner?); refusing to open it. Move the file aside or point state_dir "
                "elsewhere."
            )
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"{self.file}: could not switch to WAL mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        with self._tx() as c:
            # not executescript: it would COMMIT this transaction before running the script
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    c.execute(stmt)
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise sqlite3.ProgrammingError(f"{getattr(self, 'file', '?')}: journal is closed")
        return self._conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction under the lock: committed when the block ends, rolled back if it raises."""
        with self._lock:
            conn = self._db()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

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
        with self._lock:
            cur = self._db().execute(
                "UPDATE segments SET acked = 1 WHERE task_id = ? AND idx = ?", (task_id, int(index))
            )
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
        with self._lock:
            cur = self._db().execute(
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
        with self._lock:
            cur = self._db().execute(
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
        return len(ids)

    # -- reads ----------------------------------------------------------------------------------------------------

    def unfinished(self) -> list[JournaledTask]:
        """Tasks accepted and not finished, oldest arrival first, each with its segments in index order."""
        with self._lock:
            conn = self._db()
            tasks = [
                JournaledTask(tid, rid, rtype, json.loads(spec), arrival)
                for tid, rid, rtype, spec, arrival in conn.execute(
                    "SELECT task_id, robot_id, robot_type, spec, arrival_wall FROM tasks WHERE status = ? "
                    "ORDER BY arrival_wall, seq",
                    (ACTIVE,),
                )
            ]
            by_id = {t.task_id: t for t in tasks}
            for row in conn.execute(
                f"SELECT s.task_id, {_SEG_COLS} FROM segments s JOIN tasks t ON t.task_id = s.task_id "
                "WHERE t.status = ? ORDER BY s.task_id, s.idx",
                (ACTIVE,),
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
        """Close the database (idempotent); later calls raise ``sqlite3.ProgrammingError``."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
