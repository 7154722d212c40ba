"""Write and read planner bags: rosbag2 layout (metadata.yaml + one .mcap file), MCAP storage.

Bags are written with ``rosbags`` so that ``ros2 bag info`` / ``ros2 bag play``
on a standard ROS 2 (Jazzy, Kilted) install read them: version 9 metadata,
RIHS01 type hashes, offered QoS per topic, and our message definitions
embedded as ``ros2msg`` schemas (so MCAP tools decode them without our package).

Every failure to read a bag (missing, not a bag, truncated, corrupt) raises
:class:`BagError` with the path and what is wrong, never a bare library error.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rosbags.rosbag2 import Reader, ReaderError, StoragePlugin, Writer, WriterError
from rosbags.serde import SerdeError

from timelyllm_ros.yamlfile import yaml_error_message

from .typestore import DEFAULT_TOPICS, TopicSpec, topic_spec, typestore

MCAP_MAGIC = b"\x89MCAP0\r\n"


class BagError(RuntimeError):
    """A bag that cannot be written or read; the message says which and why."""


class BagWriter:
    """Thread-safe rosbag2/MCAP writer for a fixed set of topics.

    ``write_raw`` takes CDR bytes as rclpy hands them to a ``raw=True``
    subscription (no re-serialization); ``write`` takes a rosbags message.
    Without an explicit timestamp the receive time is taken under the lock,
    so file order and timestamp order agree (what ``ros2 bag play`` replays).
    """

    def __init__(self, path: str | Path, topics: Iterable[TopicSpec] = DEFAULT_TOPICS, *,
                 custom_data: dict[str, str] | None = None, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.path = Path(path)
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._last_ns = 0
        self.counts: dict[str, int] = {}
        self._writer = Writer(self.path, version=9, storage_plugin=StoragePlugin.MCAP)
        for k, v in (custom_data or {}).items():
            self._writer.set_custom_data(k, v)
        try:
            self._writer.open()
        except WriterError as e:
            raise BagError(f"{self.path}: cannot create the bag: {e}") from None
        self._conns: dict[str, Any] = {}
        self._specs: dict[str, TopicSpec] = {}
        for spec in topics:
            self.add_topic(spec)
        self.closed = False

    def add_topic(self, spec: TopicSpec) -> None:
        with self._lock:
            if spec.name in self._conns:
                return
            self._conns[spec.name] = self._writer.add_connection(
                spec.name, spec.msgtype, typestore=typestore(), offered_qos_profiles=[spec.qos])
            self._specs[spec.name] = spec
            self.counts[spec.name] = 0

    @property
    def message_count(self) -> int:
        return sum(self.counts.values())

    def write_raw(self, topic: str, data: bytes | memoryview, timestamp_ns: int | None = None) -> int:
        """Append one serialized (CDR) message; returns the timestamp used."""
        with self._lock:
            if self.closed:
                raise BagError(f"{self.path}: bag is closed")
            conn = self._conns.get(topic)
            if conn is None:
                raise BagError(f"{self.path}: topic {topic!r} was not added to the bag")
            ts = max(self._clock_ns(), self._last_ns) if timestamp_ns is None else int(timestamp_ns)
            self._last_ns = max(self._last_ns, ts)
            self._writer.write(conn, ts, bytes(data))
            self.counts[topic] += 1
            return ts

    def write(self, topic: str, msg: Any, timestamp_ns: int | None = None) -> int:
        """Append one rosbags message (serialized with our typestore)."""
        if topic not in self._specs:
            raise BagError(f"{self.path}: topic {topic!r} was not added to the bag")
        data = typestore().serialize_cdr(msg, self._specs[topic].msgtype)
        return self.write_raw(topic, data, timestamp_ns)

    def close(self) -> Path:
        """Finish the MCAP file (index, footer) and metadata.yaml; returns the bag folder."""
        with self._lock:
            if not self.closed:
                self.closed = True
                self._writer.close()
        return self.path

    def __enter__(self) -> BagWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class BagMessage:
    topic: str
    msgtype: str
    timestamp_ns: int  # log (receive) time
    msg: Any  # rosbags dataclass, same field names as the rclpy message


@dataclass
class TopicInfo:
    name: str
    msgtype: str
    count: int


@dataclass
class BagInfo:
    path: Path
    storage: str
    start_ns: int
    end_ns: int
    message_count: int
    topics: list[TopicInfo]
    custom_data: dict[str, str] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) * 1e-9 if self.message_count else 0.0

    def to_text(self) -> str:
        """Like ``ros2 bag info``."""
        lines = [f"Files:             {self.path}", f"Storage id:        {self.storage}",
                 f"Duration:          {self.duration_s:.9f}s"]
        if self.message_count:
            lines += [f"Start:             {_fmt_ns(self.start_ns)}", f"End:               {_fmt_ns(self.end_ns)}"]
        lines.append(f"Messages:          {self.message_count}")
        w = max((len(t.name) for t in self.topics), default=0)
        for i, t in enumerate(self.topics):
            head = "Topic information: " if i == 0 else " " * 19
            lines.append(f"{head}Topic: {t.name:<{w}} | Type: {t.msgtype} | Count: {t.count}")
        for k, v in sorted(self.custom_data.items()):
            lines.append(f"Custom data:       {k}: {v if len(v) < 80 else v[:77] + '...'}")
        return "\n".join(lines)


def _fmt_ns(ns: int) -> str:
    sec, nsec = divmod(ns, 1_000_000_000)
    return time.strftime("%b %d %Y %H:%M:%S", time.localtime(sec)) + f".{nsec:09d} ({sec}.{nsec:09d})"


def _mcap_files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(path.glob("*.mcap"))


def _check(path: Path) -> None:
    """Clear errors for the common cases before rosbags sees the file."""
    if not path.exists():
        raise BagError(f"{path}: no such bag")
    if path.is_dir() and not (path / "metadata.yaml").is_file():
        hint = " (the recorder did not finish it: convert or read its .mcap file directly)" if _mcap_files(path) else ""
        raise BagError(f"{path}: not a rosbag2 bag: no metadata.yaml{hint}")
    files = _mcap_files(path)
    if path.is_file() and path.suffix != ".mcap":
        raise BagError(f"{path}: not an MCAP file (expected a bag folder or a .mcap file)")
    for f in files:
        size = f.stat().st_size
        with f.open("rb") as fh:
            head = fh.read(8)
            fh.seek(max(0, size - 8))
            tail = fh.read(8)
        if head != MCAP_MAGIC[: len(head)] or (size >= 8 and head != MCAP_MAGIC):
            raise BagError(f"{f}: not an MCAP file (bad magic {head!r})")
        if size < 16 or tail != MCAP_MAGIC:
            raise BagError(f"{f}: truncated MCAP file ({size} bytes, no footer): the writer was stopped before "
                           "closing it")


# Whatever a damaged file makes rosbags raise (ReaderError, struct.error, OverflowError on a garbage
# length, UnicodeDecodeError in a string, ...) is a corrupt bag to the caller: one clear BagError.
_READ_ERRORS = (ReaderError, struct.error, EOFError, ValueError, KeyError, IndexError, AssertionError, OSError,
                OverflowError, MemoryError, TypeError, AttributeError, SerdeError)


def _open_reader(path: Path) -> Reader:
    _check(path)
    try:
        reader = Reader(path)
        reader.open()
    except _READ_ERRORS as e:
        raise BagError(f"{path}: corrupt bag: {type(e).__name__}: {e}") from None
    return reader


def bag_info(path: str | Path) -> BagInfo:
    """Topics, types, counts and time span of a bag."""
    path = Path(path)
    reader = _open_reader(path)
    try:
        topics = [TopicInfo(name, info.msgtype or "?", info.msgcount) for name, info in reader.topics.items()]
        custom = _custom_data(path)
        n = reader.message_count
        # rosbags' end_time is one past the last message; ros2 bag info reports the last message's time
        return BagInfo(path, "mcap", reader.start_time if n else 0, reader.end_time - 1 if n else 0, n, topics, custom)
    finally:
        reader.close()


def read_bag(path: str | Path, topics: Iterable[str] | None = None) -> Iterator[BagMessage]:
    """Messages in timestamp order, deserialized with our typestore (rosbags dataclasses)."""
    path = Path(path)
    reader = _open_reader(path)
    ts = typestore()
    wanted = set(topics) if topics is not None else None
    try:
        conns = [c for c in reader.connections if wanted is None or c.topic in wanted]
        if wanted is not None and not conns:
            return
        unknown = sorted({c.msgtype for c in conns if c.msgtype not in ts.fielddefs})
        if unknown:
            raise BagError(f"{path}: unknown message types {unknown} (neither ROS 2 standard nor timelyllm_ros)")
        for c in conns:  # our types change between versions: a differing field list would deserialize as garbage
            if c.msgtype.startswith("timelyllm_ros/") and c.digest.startswith("RIHS01_") \
                    and c.digest != (ours := ts.hash_rihs01(c.msgtype)):
                raise BagError(f"{path}: {c.topic} was recorded with another definition of {c.msgtype} ({c.digest}; "
                               f"this install has {ours}): a bag from a different timelyllm_ros version")
        it = reader.messages(connections=conns)
        while True:
            try:
                conn, t, raw = next(it)
                msg = ts.deserialize_cdr(raw, conn.msgtype)
            except StopIteration:
                return
            except _READ_ERRORS as e:
                raise BagError(f"{path}: corrupt bag: {type(e).__name__}: {e}") from None
            yield BagMessage(conn.topic, conn.msgtype, t, msg)
    finally:
        reader.close()


def _custom_data(path: Path) -> dict[str, str]:
    meta = path / "metadata.yaml"
    if not meta.is_file():
        return {}
    try:
        info = (yaml.safe_load(meta.read_text()) or {}).get("rosbag2_bagfile_information") or {}
    except yaml.YAMLError as e:
        raise BagError(f"corrupt metadata: {yaml_error_message(meta, e)}") from None
    return {str(k): str(v) for k, v in (info.get("custom_data") or {}).items()}


def custom_data(path: str | Path) -> dict[str, str]:
    """The ``custom_data`` of a bag's metadata.yaml (empty for a bare .mcap file)."""
    return bag_info(path).custom_data


def stamp_ns(t: Any) -> int:
    """builtin_interfaces/Time (rclpy or rosbags) -> integer nanoseconds."""
    return int(t.sec) * 1_000_000_000 + int(t.nanosec)


def time_msg(ns: int) -> Any:
    """Integer nanoseconds -> rosbags builtin_interfaces/Time."""
    from .typestore import msg_class

    return msg_class("builtin_interfaces/msg/Time")(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


__all__ = ["BagError", "BagInfo", "BagMessage", "BagWriter", "TopicInfo", "bag_info", "custom_data", "read_bag",
           "stamp_ns", "time_msg", "topic_spec"]
