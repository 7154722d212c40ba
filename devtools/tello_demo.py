"""The fleet demo with emulated Tello drones instead of simulated robots (needs root).

Each robot becomes a Tello SDK emulator in a network namespace of its own, driven by a
drone_executor_node through the real djitellopy. Takes every flag of ``timelyllm_ros.demo``::

    python -m devtools.tello_demo --engine engine_sim.yaml
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from devtools.emulated_fleet import start_emulated_fleet
from timelyllm_ros import demo


@contextmanager
def _tello_fleet(robots: list[str], scenes: dict[str, str], args: argparse.Namespace) -> Iterator[None]:
    with start_emulated_fleet(robots, speed=args.fleet_time_scale, scenes=scenes) as fleet:
        demo.console.print(f"emulated Tello drones: {', '.join(f'{r}@{h}' for r, h in fleet.hosts().items())}")
        yield


def main(argv: list[str] | None = None) -> int:
    demo.FLEET_HOOK = _tello_fleet
    return demo.main(argv)


if __name__ == "__main__":
    sys.exit(main())
