"""The fleet demo with emulated Tello drones instead of simulated robots (needs root).

Each robot becomes a Tello SDK emulator in a network namespace of its own, driven by a
drone_executor_node through the real djitellopy. Takes every flag of ``timelyllm_ros.demo``, and
``--fleet-log DIR``: per pass, each emulator's command log (``pass_<k>/drone_<i>.jsonl``, i: the
robot's place in the sorted robot ids) and ``executions.json``, what every
executor ran, per pass (``[[robot, task, segment, ok, error], ...]`` in the order the robot reported them).
No lone pass (``--no-bound``) unless ``--bound`` is given: the bound is the planner's on this machine, which
``make demo`` measures with the simulated fleet; here each of its tasks would fly an emulated drone of its own::

    python -m devtools.tello_demo --engine engine_sim.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from devtools.emulated_fleet import start_emulated_fleet
from timelyllm_ros import demo


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--fleet-log", default="", help="folder for the emulators' command logs and executions.json")
    ap.add_argument("--bound", action="store_true", help="also the lone pass (the bound) on emulated drones")
    own, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    if not own.bound:
        rest = [*rest, "--no-bound"]
    log_dir = Path(own.fleet_log) if own.fleet_log else None
    passes: list[list[list]] = []  # per pass of the demo: what each executor ran

    @contextmanager
    def tello_fleet(robots: list[str], scenes: dict[str, str], args: argparse.Namespace, context: Any
                    ) -> Iterator[None]:
        pass_dir = None if log_dir is None else log_dir / f"pass_{len(passes)}"
        # The demo's own context: the executors share the planner's DDS participant. The emulators' network
        # namespaces add and remove interfaces on this host, and Fast DDS takes a process's interfaces once, at
        # its first participant; with a participant of their own, the executors and the planner of this one
        # process lost each other in two CI runs of the whole suite (never matched; or silent mid-plan after
        # their first acks), which the interface churn most likely explains (not reproduced in ~20 runs).
        with start_emulated_fleet(robots, speed=args.fleet_time_scale, scenes=scenes, log_dir=pass_dir,
                                  context=context) as fleet:
            demo.console.print(f"emulated Tello drones: {', '.join(f'{r}@{h}' for r, h in fleet.hosts().items())}")
            try:
                yield
            finally:
                passes.append([[r, *h] for r, n in fleet.nodes.items() for h in n.history])
                if log_dir is not None:
                    (log_dir / "executions.json").write_text(json.dumps(passes))

    demo.FLEET_HOOK = tello_fleet
    return demo.main(rest)


if __name__ == "__main__":
    sys.exit(main())
