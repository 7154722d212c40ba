"""The journal's files (pure Python): the SQLite schema, the commit-counter sidecar, the checks a journal passes
before it is opened, and moving a damaged one aside. :class:`~timelyllm_ros.planner.journal.Journal` (its module
doc tells the whole story) opens and writes them."""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
import zlib

DB_NAME = "journal.sqlite3"
SEQ_NAME = DB_NAME + "-seq"  # sidecar: the last commit_seq known committed (see Journal)
SCHEMA_VERSION = 1

SCHEMA = """
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
CREATE TABLE IF NOT EXISTS journal_meta (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    journal_id    TEXT    NOT NULL,
    commit_seq    INTEGER NOT NULL,
    clean         INTEGER NOT NULL
);
"""

_SQLITE_MAGIC = b"SQLite format 3\x00"
_SEQ_MAGIC = "timelyllm-journal-seq/1"
_SEQ_SIZE = 128  # fixed size, overwritten in place: no allocation on a full disk, one sector (no torn record)


class JournalError(RuntimeError):
    """The journal cannot be opened or written; the message names the file or folder and the problem."""


class JournalDamagedError(JournalError, sqlite3.DatabaseError):
    """The journal is damaged or has lost commits it is known to have made; refused rather than opened with tasks
    missing. ``Journal(..., reset_damaged=True)`` moves its files aside (never deletes them) and starts empty."""


class JournalVersionError(JournalError):
    """The journal file was written by a newer (or unknown) schema; refusing it rather than misreading it."""


def _expected_columns() -> dict[str, list[str]]:
    """Column names of each table, from ``SCHEMA`` itself (one source of truth for the schema check)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(SCHEMA)
        return {name: [c[1] for c in conn.execute(f"PRAGMA table_info({name})")]
                for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


COLUMNS = _expected_columns()


def seq_record(journal_id: str, seq: int) -> bytes:
    body = f"{_SEQ_MAGIC} {journal_id} {seq}"
    line = f"{body} {zlib.crc32(body.encode()):08x}\n".encode()
    return line.ljust(_SEQ_SIZE, b" ")


def _is_damage(e: sqlite3.Error) -> bool:
    """SQLite's verdict on the file's content (corrupt, not a database) rather than on the storage under it
    (full, read-only, locked, I/O error): only the former is damage that a reset may move aside."""
    name = getattr(e, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return True
    return type(e) is sqlite3.DatabaseError


def damaged(problem: str) -> JournalDamagedError:
    return JournalDamagedError(
        f"journal {problem}. Refusing to open it: tasks would be missing. Inspect or restore the files, or start "
        "over with reset_damaged=True (planner parameter journal_reset_damaged:=true), which moves them aside"
    )


def sqlite_error(file: str, folder: str, e: sqlite3.Error, doing: str) -> JournalError:
    """A failure of SQLite as the journal error naming the file: damage, or the storage under it."""
    if _is_damage(e):
        return damaged(f"{file}: {e}")
    hint = f" (the disk holding {folder} is full)" if "full" in str(e).lower() else ""
    return JournalError(f"journal {file}: cannot {doing}: {e}{hint}")


def read_seq(seq_fd: int, seq_file: str) -> tuple[str, int] | None:
    """The sidecar's ``(journal_id, commit_seq)``; None when it is empty (new, or never written)."""
    assert seq_fd is not None
    data = os.pread(seq_fd, 4096, 0)
    if not data.strip(b" \n\x00"):
        return None
    parts = data.decode("ascii", "replace").split()
    body = " ".join(parts[:3])
    if len(parts) != 4 or parts[0] != _SEQ_MAGIC or not parts[2].isdigit() or \
            parts[3] != f"{zlib.crc32(body.encode()):08x}":
        raise damaged(f"sequence file {seq_file} is unreadable (it holds {data[:60]!r})")
    return parts[1], int(parts[2])


def check_files(file: str, folder: str, seq_file: str, seq_fd: int, warnings: list[str]) -> tuple[str | None, int]:
    """Refuse a damaged or incomplete journal (see :class:`~timelyllm_ros.planner.journal.Journal`): its journal_id
    and the commits it holds, or (None, 0) for a journal to create (new, or one from before journal_meta).
    ``warnings``: what the caller should log, appended."""
    side = read_seq(seq_fd, seq_file)
    wal = file + "-wal"
    try:
        db_size = os.path.getsize(file) if os.path.exists(file) else None
        wal_size = os.path.getsize(wal) if os.path.exists(wal) else None
        head = b""
        if db_size:
            with open(file, "rb") as f:
                head = f.read(100)
    except OSError as e:
        raise JournalError(f"journal {file}: cannot read it: {e.strerror or e}") from e
    if not db_size:
        # Checked before SQLite sees it: on an empty main file SQLite deletes the -wal beside it.
        what = "is missing" if db_size is None else "is empty (0 bytes)"
        if wal_size:
            raise damaged(f"{file} {what} but {wal} holds {wal_size} bytes of it: the main file was "
                                "deleted or truncated")
        if side is not None and side[1] > 0:
            raise damaged(f"{file} {what} but {seq_file} records {side[1]} commits to it")
        return None, 0
    if len(head) < 100 or not head.startswith(_SQLITE_MAGIC):
        raise damaged(f"{file} is not an SQLite database ({db_size} bytes, starting {head[:16]!r})")
    try:
        conn = sqlite3.connect(f"file:{urllib.parse.quote(file)}?mode=ro", uri=True, timeout=10.0)
    except sqlite3.Error as e:
        raise sqlite_error(file, folder, e, "open it") from e
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != 0 and version != SCHEMA_VERSION:
            raise JournalVersionError(
                f"{file}: journal schema version {version} is not the supported version {SCHEMA_VERSION} "
                "(written by a newer planner?); refusing to open it. Move the file aside or point state_dir "
                "elsewhere."
            )
        verdict = [str(r[0]) for r in conn.execute("PRAGMA integrity_check(10)")]
        tables = {
            name: [c[1] for c in conn.execute(f'PRAGMA table_info("{name}")')]
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        }
        meta = (conn.execute("SELECT journal_id, commit_seq, clean FROM journal_meta WHERE id = 1").fetchone()
                if tables.get("journal_meta") == COLUMNS["journal_meta"] else None)
    except sqlite3.Error as e:
        raise sqlite_error(file, folder, e, "read it") from e
    finally:
        conn.close()  # read-only: never checkpoints, so the -wal stays as found
    if verdict != ["ok"]:
        raise damaged(f"{file} fails SQLite's integrity check: {'; '.join(verdict[:5])}")
    if not tables:
        if version != 0 or (side is not None and side[1] > 0):
            raise damaged(f"{file} has no tables, but its schema version is {version} and "
                                f"{seq_file} records {side[1] if side else 0} commits")
        return None, 0
    if version == 0:
        raise damaged(f"{file} is not a task journal (tables {sorted(tables)}, schema version 0)")
    for name, cols in COLUMNS.items():
        if tables.get(name) != cols and not (name == "journal_meta" and name not in tables):
            raise damaged(f"{file}: schema mismatch: table {name} has columns {tables.get(name)}, "
                                f"expected {cols}")
    if meta is None:  # a journal written before the commit counter existed
        if side is not None and side[1] > 0:
            raise damaged(f"{file} has no commit counter but {seq_file} records {side[1]} "
                                "commits: the main file was replaced by an older copy, or its -wal lost")
        warnings.append(f"{file} predates loss detection: what it may have lost before now cannot be "
                             "known; commits are counted from now on")
        return None, 0
    journal_id, seq, clean = meta
    wal_state = (f"the -wal {wal} is missing or empty (deleted?)" if not wal_size else
                 f"the -wal ({wal_size} bytes) was truncated or corrupted, or the main file replaced by an older "
                 "copy")
    if side is None:
        if not clean:
            raise damaged(f"sequence file {seq_file} is missing or empty, and {file} was not "
                                "closed cleanly: whether commits were lost with its -wal cannot be told")
        warnings.append(f"sequence file {seq_file} was missing; {file} had been closed cleanly "
                             "(nothing can have been lost), so it is written again")
    elif side[0] != journal_id:
        raise damaged(f"sequence file {seq_file} belongs to another journal ({side[0]}, not "
                            f"{journal_id}): files of two journals mixed")
    elif seq < side[1]:
        raise damaged(f"{file} holds {seq} commits but {seq_file} records {side[1]}: the last "
                            f"{side[1] - seq} were lost ({wal_state})")
    return str(journal_id), int(seq)


def move_aside(file: str) -> list[str]:
    """Rename the journal's files (db, -wal, -shm, -seq) to ``journal.sqlite3.damaged-<time>...``, so they
    stay together (SQLite finds the -wal of the renamed db) and nothing is deleted."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    suffixes = ("", "-wal", "-shm", "-seq")
    base, n = f"{file}.damaged-{stamp}", 1
    while any(os.path.lexists(base + s) for s in suffixes):
        base, n = f"{file}.damaged-{stamp}.{n}", n + 1
    moved = []
    for s in suffixes:
        if os.path.lexists(file + s):
            try:
                os.rename(file + s, base + s)
            except OSError as e:
                raise JournalError(f"cannot move {file + s} aside to {base + s}: {e.strerror or e}") from e
            moved.append(base + s)
    return moved
