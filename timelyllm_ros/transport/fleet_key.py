"""The optional fleet key (issue 39, item 9): an HMAC-SHA256 over each segment's, ack's and report's fields, with
the sender's counter against replays. Pure Python (hashlib, hmac); ``ros/fleet_auth.py`` maps messages to fields.

Where SROS2 is not available (the PyPI Fast DDS has no security plugins) a node on the DDS domain can take the
planner's name, so the writer check (``ros/segment_gate.py``) does not tell a segment is the planner's. A key shared
by the planner, the executors and the simulated fleet does: a message without a valid tag is refused and counted.

The counter: each sender's is strictly increasing, started at its wall clock in microseconds, so it keeps
increasing across a restart. A receiver refuses a counter it has taken before, one ``WINDOW`` (of the counter's
microseconds) or more below the highest it has taken from that sender (messages of several threads and topics may
arrive out of order within that), and one whose time is further than ``max_age_s`` from its own clock (a message
recorded before the receiver restarted). It remembers at most ``MAX_TAKEN`` counters per sender; past that, the
older half is refused from then on, taken or not. A key shared by the whole fleet: any holder of it can sign as
any robot or as the planner; it keeps out nodes without it (README "Threat model").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

MIN_KEY_BYTES = 16
# Counters below the highest taken from a sender that may still arrive (reordering), in the counter's unit: the
# sender's clock in microseconds. It was 4096 counters, 4 ms of a sender's time: two acks a robot signed 4.4 ms
# apart on two threads, taken in the other order, had the second refused as a replay (a loaded CI machine).
WINDOW = 10_000_000
MAX_TAKEN = 8192  # counters remembered per sender (bounded memory)


def load_key(path: str, parameter: str = "fleet_key_file") -> bytes:
    """The key in file ``path`` (surrounding whitespace stripped), or ValueError naming the parameter and file."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as e:
        raise ValueError(f"{parameter}: cannot read the fleet key file {path!r}: {e.strerror or e}") from None
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{parameter}: the fleet key in {path!r} has {len(key)} bytes, fewer than {MIN_KEY_BYTES} "
                         "(e.g. `head -c 32 /dev/urandom | base64 > fleet.key`)")
    return key


def digest(key: bytes, kind: str, seq: int, fields: Sequence[object]) -> str:
    """The hex tag of a message of ``kind`` with counter ``seq`` and ``fields`` (strings, numbers, booleans, lists):
    HMAC-SHA256 over their JSON, an unambiguous encoding."""
    data = json.dumps([kind, seq, *fields], ensure_ascii=False, separators=(",", ":")).encode()
    return hmac.new(key, data, hashlib.sha256).hexdigest()


class FleetKey:
    """Signs what this process sends and checks what it receives, with one key. Thread-safe. ``max_age_s``: how far
    a counter's time may be from this process's clock; ``max_senders``: senders whose counters are remembered (the
    least recently heard forgotten first; only messages with a valid tag make a sender known)."""

    def __init__(self, key: bytes, *, max_age_s: float = 300.0, max_senders: int = 10_000) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"fleet key: {len(key)} bytes, fewer than {MIN_KEY_BYTES}")
        self._key, self._max_age_us, self._max_senders = key, int(max_age_s * 1e6), max_senders
        self._last = 0
        # sender -> (highest taken, floor: refused at or below, counters taken above the floor)
        self._seen: OrderedDict[str, tuple[int, int, set[int]]] = OrderedDict()
        self._lock = threading.Lock()

    def next_seq(self) -> int:
        with self._lock:
            self._last = max(self._last + 1, time.time_ns() // 1000)
            return self._last

    def sign(self, kind: str, fields: Sequence[object]) -> tuple[int, str]:
        """(counter, hex tag) for a message of ``kind`` with ``fields``."""
        seq = self.next_seq()
        return seq, digest(self._key, kind, seq, fields)

    def check(self, kind: str, sender: str, fields: Sequence[object], seq: int, tag: str) -> str | None:
        """Why the message is refused ('no fleet key tag', 'wrong fleet key tag', 'replayed counter ...', 'stale
        counter ...'), or None: it is taken, and its counter with it."""
        if not tag:
            return "no fleet key tag (auth_tag empty): the sender has no fleet key"
        if not hmac.compare_digest(tag, digest(self._key, kind, seq, fields)):
            return "wrong fleet key tag (auth_tag): not signed with this fleet's key, or altered"
        off_s = (seq - time.time_ns() // 1000) / 1e6
        if abs(off_s) * 1e6 > self._max_age_us:
            return (f"stale counter (auth_seq {seq}: {off_s:+.1f} s from this clock, more than "
                    f"{self._max_age_us / 1e6:g} s): replayed, or the clocks differ")
        with self._lock:
            high, floor, taken = self._seen.pop(sender, (0, 0, set()))
            try:
                if seq in taken or seq <= max(floor, high - WINDOW):
                    return f"replayed counter (auth_seq {seq}; highest taken from {sender!r}: {high})"
                taken.add(seq)
                high = max(high, seq)
                if len(taken) > MAX_TAKEN:
                    floor = max(floor, high - WINDOW)
                    taken = {s for s in taken if s > floor}
                    if len(taken) > MAX_TAKEN // 2:  # still too many within the window: refuse the older half
                        newest = sorted(taken)[-(MAX_TAKEN // 2):]
                        floor, taken = newest[0] - 1, set(newest)
            finally:
                self._seen[sender] = (high, floor, taken)
                if len(self._seen) > self._max_senders:
                    self._seen.popitem(last=False)
        return None


__all__ = ["MAX_TAKEN", "MIN_KEY_BYTES", "WINDOW", "FleetKey", "digest", "load_key"]
