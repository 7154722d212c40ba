"""The simulated robots of a demo or benchmark run, in a process of their own.

They stand in for robots on other machines: in the planner's process their nodes (21 drones' sessions, heartbeats,
reports), the workload client's goals and the bag recorder took the GIL and the cores the engine's steps need
(bench/results/demo_cpu/). Here they run in a child process at a lower priority (``nice``), talk to the planner
over DDS as real robots would, and hand back what the robots saw.

    with RobotsProcess(RobotsSpec(jobs, speed=3.0)) as robots:
        for kind, data in robots.events():   # ("segment", {...}), ("done", {...}), ... as they happen
            ...
        records = robots.records()

The child is ``python -m timelyllm_ros.ros.robots_process SPEC OUT``: SPEC a pickled :class:`RobotsSpec`, OUT where
it pickles its records; it prints one JSON event per line on stdout. ``mode="alone"`` sends the jobs one at a time,
each waiting for the one before to be answered (WorkloadClient.run_alone): the first segment each task gets when
served alone, the bound a run is set beside (measure/bound.py).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timelyllm_ros.measure.records import TaskRecord
from timelyllm_ros.sim.workloads import Job

MODES = ("workload", "alone")


@dataclass
class RobotsSpec:
    """What the robots' process does: the jobs to send (at ``trigger_time / speed``), how."""

    jobs: list[Job]
    speed: float = 1.0
    mode: str = "workload"
    fleet_time_scale: float = 1.0
    seed: int = 0
    timeout_s: float = 600.0
    bag: str = ""  # record the run into this bag folder ('' = no bag)
    nice: int = 10  # lower priority than the planner's engine
    robot_ids: dict[int, str] = field(default_factory=dict)  # job id -> robot id where not robot_id_of(job)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"RobotsSpec.mode must be one of {MODES}, got {self.mode!r}")
        if not self.speed > 0:
            raise ValueError(f"RobotsSpec.speed must be > 0, got {self.speed!r}")


class RobotsProcess:
    """The child process of :mod:`timelyllm_ros.ros.robots_process`; a context manager that ends it."""

    def __init__(self, spec: RobotsSpec) -> None:
        self.spec = spec
        self._dir = tempfile.TemporaryDirectory(prefix="timelyllm-robots-")
        self._spec_path = Path(self._dir.name) / "spec.pkl"
        self._out_path = Path(self._dir.name) / "records.pkl"
        self._spec_path.write_bytes(pickle.dumps(spec))
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: list[str] = []

    def __enter__(self) -> RobotsProcess:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "timelyllm_ros.ros.robots_process", str(self._spec_path), str(self._out_path)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        threading.Thread(target=self._drain_stderr, name="robots-stderr", daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        p = self._proc
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._dir.cleanup()

    def _drain_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-200]

    def events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each event the child reports, until it ends: ("started", {t}), ("segment", {...}), ("done", {...}),
        ("warning", {text}); a child that ends without its records raises RuntimeError with its last output."""
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                kind, data = json.loads(line)
            except (ValueError, TypeError):
                continue  # a library's own print
            yield kind, data
        rc = self._proc.wait()
        if rc != 0 or not self._out_path.exists():
            raise RuntimeError(f"the robots' process ended with exit code {rc}:\n{''.join(self._stderr[-30:])}")

    def records(self) -> list[TaskRecord]:
        """What the robots saw (after :meth:`events` ended)."""
        return pickle.loads(self._out_path.read_bytes())


def _emit(kind: str, **data: Any) -> None:
    print(json.dumps([kind, data]), flush=True)


def _run(spec: RobotsSpec, out: Path) -> int:
    import rclpy
    from rclpy.parameter import Parameter

    from timelyllm_ros.ros.recorder_node import start_recorder
    from timelyllm_ros.ros.sim_fleet_node import SimFleetNode
    from timelyllm_ros.ros.spin import PooledExecutor, Spinner
    from timelyllm_ros.ros.workload_client import WorkloadClient, robot_id_of, robot_type_of

    if spec.nice:
        os.nice(spec.nice)
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    by_type: dict[str, set[str]] = {}
    for j in spec.jobs:
        by_type.setdefault(robot_type_of(j), set()).add(spec.robot_ids.get(j.job_id) or robot_id_of(j))
    # One simulated fleet per robot type: a fleet runs one skill set (an arm workload needs arm robots).
    fleets = [SimFleetNode("sim_fleet" if len(by_type) == 1 else f"sim_fleet_{rt}", context=ctx,
                           parameter_overrides=[Parameter("robots", value=sorted(ids)),
                                                Parameter("robot_type", value=rt),
                                                Parameter("time_scale", value=spec.fleet_time_scale),
                                                Parameter("seed", value=spec.seed)])
              for rt, ids in sorted(by_type.items())]
    t0 = [time.monotonic()]

    def segment(rec: TaskRecord, seg: Any) -> None:
        _emit("segment", t=time.monotonic() - t0[0], robot=f"{rec.robot_type}_{rec.agent_id}", level=rec.level,
              task_type=rec.task_type, index=seg.index, text=seg.text)

    def done(rec: TaskRecord) -> None:
        _emit("done", robot=f"{rec.robot_type}_{rec.agent_id}", task_type=rec.task_type, status=rec.status,
              reason=rec.reason)

    client = WorkloadClient(spec.jobs, speed=spec.speed, on_segment=segment, on_done=done, context=ctx,
                            robot_ids=spec.robot_ids)
    ex = PooledExecutor(num_threads=16, context=ctx)
    for n in (*fleets, client):
        ex.add_node(n)
    spinner = Spinner(ex, name="timelyllm-robots")
    spinner.start()
    recorder = None
    try:
        if not client.wait_for_planner(60):
            raise RuntimeError("the planner's action server never came up")
        if spec.bag:
            recorder = start_recorder(ctx, spec.bag)
        t0[0] = time.monotonic()
        _emit("started", t=t0[0])
        records = client.run_alone(spec.timeout_s) if spec.mode == "alone" else client.run(timeout=spec.timeout_s)
        if client.resent:
            _emit("warning", text=f"{client.resent} goal(s) sent again: no goal response in time")
        if not client.wait_for_reports(timeout=60):
            _emit("warning", text="some robots did not report every segment in time")
        if recorder is not None:
            n_msgs = sum(recorder.counts.values())
            _emit("recorded", messages=n_msgs, bag=str(recorder.stop()))
        out.write_bytes(pickle.dumps(records))
    finally:
        spinner.ex.shutdown(timeout_sec=5)
        spinner.join(timeout=5)
        for n in (*fleets, client):
            n.destroy_node()
        rclpy.shutdown(context=ctx)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m timelyllm_ros.ros.robots_process SPEC.pkl OUT.pkl", file=sys.stderr)
        return 2
    spec = pickle.loads(Path(argv[0]).read_bytes())
    return _run(spec, Path(argv[1]))


if __name__ == "__main__":
    sys.exit(main())
