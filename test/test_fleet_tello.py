"""One planner serving a fleet of emulated Tello drones at once, end to end: PlanTask goals -> planner
(simulated engine) -> per-robot segments -> drone executors -> real djitellopy -> Tello SDK emulators in
network namespaces -> SegmentDone back to the planner."""

from __future__ import annotations

import pytest

from devtools.netns import netns_unavailable_reason

pytest.importorskip("rclpy")
from test_planner_node import CAT, NORMAL, URGENT, Stack, _wait  # noqa: E402

from timelyllm_ros.action import PlanTask  # noqa: E402

pytestmark = pytest.mark.ros
_WHY = netns_unavailable_reason()

BOOK = ("Scene: [cabinet_1 x:0.48 y:0.55 width:0.49 height:0.91] Task: [A] Move up and then check the top of "
        "the cabinet, if you see a book, take a picture of it.")
BOY = ("Scene: [boy x:0.48 y:0.51 width:0.2 height:0.4] Task: [E] You provided me with plan mf,100, but I "
       "encountered a failure because a boy is passing by. Execution history: mf(50)")


@pytest.mark.skipif(_WHY is not None, reason=f"emulated Tellos need network namespaces: {_WHY}")
def test_one_planner_serves_several_emulated_tellos_at_once(tmp_path):
    from devtools.emulated_fleet import start_emulated_fleet

    robots = ["drone_0", "drone_1", "drone_2"]
    scenes = {"drone_0": "Scene: [cat x:0.5 y:0.5 width:0.2 height:0.2]",
              "drone_1": "Scene: [book x:0.5 y:0.4 width:0.1 height:0.1]", "drone_2": "Scene: []"}
    with start_emulated_fleet(robots, speed=0.2, scenes=scenes, log_dir=tmp_path) as fleet:
        s = Stack(sim_fleet=False)
        try:
            sent = [s.send("drone_0", CAT, NORMAL), s.send("drone_1", BOOK, NORMAL), s.send("drone_2", BOY, URGENT)]
            results = [s.result(h, timeout=60) for _, h in sent]
            # the robots report every segment they executed back to the planner
            for (fb, _), r in zip(sent, results, strict=True):
                assert r.status == PlanTask.Result.STATUS_SUCCEEDED, r.message
                tid = fb[0][1].segment.task_id
                assert _wait(lambda tid=tid: all(seg.real_end is not None
                                                 for seg in s.planner.core.result(tid).segments), 30)
        finally:
            s.close()
    cmds = {r: fleet.drones[r].commands() for r in robots}
    connect = ["command", "battery?", "takeoff"]
    # ?s('cat')==True{g('cat')};  scan finds the cat in view, then goto = approach (forward)
    assert cmds["drone_0"][:3] == connect and any(c.startswith("forward") for c in cmds["drone_0"][3:])
    # mu(50);?iv('book')==True{tp()};  up 50, the book is seen, a picture needs no SDK motion
    assert cmds["drone_1"][:4] == connect + ["up 50"]
    # d(3);mf(100);  wait, then forward 100
    assert "forward 100" in cmds["drone_2"][3:]
    for r in robots:
        assert cmds[r][-1] == "land"  # executor shutdown lands every drone
