"""``timelyllm-bench fleet-key``: what the fleet key (issue 39, item 9) costs per message, in one process.

For a segment (a typical one: 3 skill calls, stamps and a deadline), an ack and a report: the time to sign one
(``FleetAuth.sign``: its fields to canonical JSON, HMAC-SHA256, counter) and to check one (the same, a constant-time
compare and the replay window), the median of ``--rounds`` rounds of ``--n`` messages each, beside rclpy's own
serialization of the same message (``rclpy.serialization.serialize_message``: what a publish costs at least), and
the bytes the tag and counter add on the wire. No DDS traffic: the cost is CPU per message at either end.
Writes ``results.json`` and ``results.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import print_table, results_root

DEFAULT_OUT = results_root() / "fleet_key"
KEY = b"0123456789abcdef0123456789abcdef"


def _messages() -> dict[str, Any]:
    from builtin_interfaces.msg import Duration, Time

    from timelyllm_ros.msg import PlanSegment, SegmentAck, SegmentDone, SkillCall

    calls = [SkillCall(name=n, long_name=ln, raw=raw, args=[a], skillset_id="drone_minispec")
             for n, ln, raw, a in (("sa", "scan_abstract", "sa('cat')", "'cat'"),
                                   ("mf", "move_forward", "mf(50)", "50"), ("tc", "turn_cw", "tc(90)", "90"))]
    now = Time(sec=1_795_900_000, nanosec=123_456_789)
    return {
        "segment": lambda: PlanSegment(task_id="drone_3-1a2b3c4d", robot_id="drone_3", segment_index=2,
                                       text="?sa('cat')==True{mf(50);tc(90);", skills=list(calls), is_final=False,
                                       stamp_generated=now, predicted_execution=Duration(sec=6, nanosec=500),
                                       next_segment_deadline=now),
        "ack": lambda: SegmentAck(task_id="drone_3-1a2b3c4d", robot_id="drone_3", segment_index=2, stamp=now,
                                  running=True),
        "report": lambda: SegmentDone(task_id="drone_3-1a2b3c4d", robot_id="drone_3", segment_index=2, start=now,
                                      finish=now, success=True, error=""),
    }


def _per_message_us(fn: Any, msgs: list[Any], rounds: int) -> float:
    """Median over rounds of the mean time per message, microseconds."""
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for m in msgs:
            fn(m)
        out.append((time.perf_counter() - t0) / len(msgs) * 1e6)
    return statistics.median(out)


def measure(n: int, rounds: int) -> list[dict[str, Any]]:
    from rclpy.serialization import serialize_message

    from timelyllm_ros.ros.fleet_auth import FleetAuth
    from timelyllm_ros.transport.fleet_key import FleetKey

    rows = []
    for kind, make in _messages().items():
        sender, receiver = FleetAuth(FleetKey(KEY)), FleetAuth(FleetKey(KEY))
        msgs = [make() for _ in range(n)]
        plain_bytes = len(serialize_message(msgs[0]))
        serialize_us = _per_message_us(serialize_message, msgs, rounds)
        sign_us = _per_message_us(sender.sign, msgs, rounds)
        signed_bytes = len(serialize_message(msgs[0]))
        # each round checks freshly signed copies: a message checked twice is a replay, refused early
        batches = [[sender.sign(make()) for _ in range(n)] for _ in range(rounds)]
        times = []
        for batch in batches:
            t0 = time.perf_counter()
            refused = [receiver.check(m) for m in batch]
            times.append((time.perf_counter() - t0) / n * 1e6)
            assert not any(refused), refused[:1]
        rows.append({"message": kind, "sign_us": sign_us, "check_us": statistics.median(times),
                     "serialize_us": serialize_us, "bytes_without_key": plain_bytes, "bytes_with_key": signed_bytes})
    return rows


def cmd_fleet_key(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = measure(args.n, args.rounds)
    header = ["message", "sign, µs", "check, µs", "rclpy serialize, µs", "CDR bytes (no key)", "CDR bytes (key)"]
    table = [[r["message"], f"{r['sign_us']:.1f}", f"{r['check_us']:.1f}", f"{r['serialize_us']:.1f}",
              str(r["bytes_without_key"]), str(r["bytes_with_key"])] for r in rows]
    print_table(f"Fleet key: cost per message (median of {args.rounds} rounds of {args.n})", header, table)
    (out / "results.json").write_text(json.dumps({"args": {"n": args.n, "rounds": args.rounds}, "rows": rows},
                                                 indent=1))
    lines = ["# Fleet key: cost per message", "",
             f"`python -m bench.fleet_key_cost --n {args.n} --rounds {args.rounds}` (one process, no DDS traffic; "
             "median of the rounds). CDR bytes without the key: the same message, its counter 0 and its tag empty.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print(f"results: {out / 'results.md'}")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("fleet-key", help="the fleet key's cost per segment, ack and report (sign, check, bytes)")
    p.add_argument("--n", type=int, default=5000, help="messages per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.set_defaults(fn=cmd_fleet_key)
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.fleet_key_cost")
    add_parser(ap.add_subparsers())
    args = ap.parse_args(["fleet-key", *(sys.argv[1:] if argv is None else argv)])
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
