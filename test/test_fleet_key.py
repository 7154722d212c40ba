"""The optional fleet key (issue 39, item 9): an HMAC over each segment's, ack's and report's fields with the sender's
counter against replays. The key itself (no ROS), the fields of each message, and the planner refusing an ack or a
report without the key (and running a fleet that holds it). The executors' and the simulated fleet's side:
test/test_executors_ros.py."""

from __future__ import annotations

import time

import pytest
from waiting import wait_until

from timelyllm_ros.transport.fleet_key import MAX_TAKEN, WINDOW, FleetKey, digest, load_key

KEY = b"0123456789abcdef0123456789abcdef"


def test_a_signed_message_is_taken_once_and_one_without_the_key_is_refused_saying_why():
    a, b = FleetKey(KEY), FleetKey(KEY)
    seq, tag = a.sign("ack", ["t", "r", 0])
    assert b.check("ack", "r", ["t", "r", 0], seq, tag) is None
    assert b.check("ack", "r", ["t", "r", 0], seq, tag).startswith("replayed counter")
    seq, tag = a.sign("ack", ["t", "r", 1])
    assert b.check("ack", "r", ["t", "r", 2], seq, tag).startswith("wrong fleet key tag")  # a field changed
    assert b.check("report", "r", ["t", "r", 1], seq, tag).startswith("wrong fleet key tag")  # an ack as a report
    assert b.check("ack", "r", ["t", "r", 1], seq + 1, tag).startswith("wrong fleet key tag")  # its counter changed
    assert b.check("ack", "r", ["t", "r", 1], 0, "").startswith("no fleet key tag")
    other = FleetKey(b"another key of sixteen bytes or more")
    assert b.check("ack", "r", ["t", "r", 1], *other.sign("ack", ["t", "r", 1])).startswith("wrong fleet key tag")


def test_counters_signed_milliseconds_apart_may_arrive_out_of_order_and_memory_stays_bounded():
    """The window was 4096 counters, which are a sender's clock in microseconds: two acks signed 4.4 ms apart, taken
    in the other order, had the second refused as a replay (CI on a loaded machine). A window of the sender's
    time now; each sender's memory stays bounded, and what it forgets is refused, never taken twice."""
    a, b = FleetKey(KEY), FleetKey(KEY)
    first = a.sign("ack", [0])
    time.sleep(0.02)
    second = a.sign("ack", [1])
    assert second[0] - first[0] > 4096
    assert b.check("ack", "r", [1], *second) is None and b.check("ack", "r", [0], *first) is None
    assert b.check("ack", "r", [0], *first).startswith("replayed")
    signed = [a.sign("ack", [i]) for i in range(3 * MAX_TAKEN)]
    assert all(b.check("ack", "r", [i], *signed[i]) is None for i in range(len(signed)))
    assert len(b._seen["r"][2]) <= MAX_TAKEN
    assert all(b.check("ack", "r", [i], *signed[i]).startswith("replayed") for i in range(len(signed)))
    floor = b._seen["r"][1]  # below it, what was forgotten: refused whether taken or not, never risked
    assert signed[0][0] <= floor < signed[-1][0]
    assert b.check("ack", "r", [9], floor, digest(KEY, "ack", floor, [9])).startswith("replayed")
    newer = signed[-1][0] + 5
    assert b.check("ack", "r", [9], newer, digest(KEY, "ack", newer, [9])) is None


def test_counters_may_arrive_out_of_order_within_the_window_but_never_twice_and_not_stale():
    a, b = FleetKey(KEY), FleetKey(KEY)
    signed = [a.sign("ack", [i]) for i in range(5)]
    assert [b.check("ack", "r", [i], *signed[i]) for i in (4, 1, 3, 0, 2)] == [None] * 5
    assert all(b.check("ack", "r", [i], *signed[i]).startswith("replayed") for i in range(5))
    assert b.check("ack", "other", [0], *signed[0]) is None  # another sender's window
    # a counter never taken but from before the window, and one whose time is far from this clock (a message
    # recorded before the receiver restarted)
    high = a.sign("ack", ["x"])[0]
    assert b.check("ack", "r", ["x"], high, digest(KEY, "ack", high, ["x"])) is None
    below = high - WINDOW
    assert b.check("ack", "r", [0], below, digest(KEY, "ack", below, [0])).startswith("replayed counter")
    assert b.check("ack", "r", [0], below + 1, digest(KEY, "ack", below + 1, [0])) is None
    old = time.time_ns() // 1000 - 10**9  # 1,000 s ago
    assert b.check("ack", "fresh", [0], old, digest(KEY, "ack", old, [0])).startswith("stale counter")


def test_the_counter_keeps_increasing_across_a_restart():
    first = FleetKey(KEY)
    last = max(first.sign("segment", [i])[0] for i in range(1000))
    assert FleetKey(KEY).sign("segment", [0])[0] > last  # a wall clock in microseconds, not 1 again


def test_a_key_file_missing_or_too_short_is_refused_naming_the_parameter_and_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"fleet_key_file: cannot read the fleet key file .*none\.key"):
        load_key(str(tmp_path / "none.key"))
    (tmp_path / "k").write_bytes(b"  short  \n")
    with pytest.raises(ValueError, match=r"fleet_key_file: the fleet key in .*/k' has 5 bytes, fewer than 16"):
        load_key(str(tmp_path / "k"))
    (tmp_path / "k").write_bytes(KEY + b"\n")
    assert load_key(str(tmp_path / "k")) == KEY


def test_each_message_s_tag_covers_every_field_a_robot_or_the_planner_acts_on():
    from timelyllm_ros.msg import PlanSegment, SegmentAck, SegmentDone, SkillCall
    from timelyllm_ros.ros.fleet_auth import FleetAuth

    a, b = FleetAuth(FleetKey(KEY)), FleetAuth(FleetKey(KEY))
    seg = a.sign(PlanSegment(task_id="t", robot_id="r", segment_index=0, text="mf(20);",
                             skills=[SkillCall(name="mf", raw="mf(20)", args=["20"])]))
    seg.skills[0].args = ["500"]  # the skill the robot runs, not the text, changed
    assert b.check(seg).startswith("wrong fleet key tag")
    done = a.sign(SegmentDone(task_id="t", robot_id="r", segment_index=0, success=False, error="x"))
    done.success = True
    assert b.check(done).startswith("wrong fleet key tag")
    ack = a.sign(SegmentAck(task_id="t", robot_id="r", segment_index=0))
    ack.robot_id = "r2"  # another robot's ack
    assert b.check(ack).startswith("wrong fleet key tag")
    assert FleetAuth(None).check(SegmentAck()) is None and FleetAuth(None).sign(SegmentAck()).auth_tag == ""


@pytest.mark.ros
def test_a_planner_with_a_fleet_key_serves_a_fleet_holding_it_and_refuses_unsigned_or_replayed_reports(tmp_path):
    """The planner signs its segments (the fleet runs them: the task ends DONE) and counts, without acting on it, a
    report with no tag, one signed with another key, and a replayed ack of the fleet's own."""
    import rclpy
    from rclpy.parameter import Parameter

    from timelyllm_ros.domain.types import TaskStatus
    from timelyllm_ros.engines.sim_realtime import RealtimeSimEngine
    from timelyllm_ros.msg import SegmentAck, SegmentDone
    from timelyllm_ros.ros import topics
    from timelyllm_ros.ros.fleet_auth import FleetAuth
    from timelyllm_ros.ros.planner_node import build_planner
    from timelyllm_ros.ros.sim_fleet_node import SimFleetNode
    from timelyllm_ros.ros.spin import PooledExecutor, Spinner

    key = tmp_path / "fleet.key"
    key.write_bytes(KEY)
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    planner, sched = build_planner([Parameter("warm_up", value=False), Parameter("fleet_key_file", value=str(key))],
                                   engine=RealtimeSimEngine(), context=ctx)  # the simulated engine, in real time
    fleet = SimFleetNode(context=ctx, parameter_overrides=[Parameter("robots", value=["k_0"]),
                                                           Parameter("time_scale", value=0.01),
                                                           Parameter("fleet_key_file", value=str(key))])
    rogue = rclpy.create_node("mallory", context=ctx)
    acks: list[SegmentAck] = []
    rogue.create_subscription(SegmentAck, topics.SEGMENT_ACKS, acks.append, topics.REPORTS)
    done_pub = rogue.create_publisher(SegmentDone, topics.SEGMENT_DONE, topics.REPORTS)
    ack_pub = rogue.create_publisher(SegmentAck, topics.SEGMENT_ACKS, topics.REPORTS)
    ex = PooledExecutor(num_threads=4, context=ctx)
    for node in (planner, sched, fleet, rogue):
        ex.add_node(node)
    spin = Spinner(ex)
    spin.start()
    try:
        assert wait_until(lambda: planner.count_subscribers(topics.segment_topic("k_0")) > 0, 30)
        tid = _plan(planner, "k_0")
        assert wait_until(lambda: planner.core.result(tid) is not None, 30)
        assert wait_until(lambda: any(a.task_id == tid for a in acks), 10)
        assert planner.core.result(tid).status is TaskStatus.DONE, planner.core.result(tid).reason
        assert planner.rejected.total == 0, planner.rejected.snapshot()  # the fleet's own acks and reports count
        other = FleetAuth(FleetKey(b"another key of sixteen bytes or more"))
        forged = SegmentDone(task_id=tid, robot_id="k_0", segment_index=0, success=False, error="forged")
        done_pub.publish(forged)  # no tag
        done_pub.publish(other.sign(SegmentDone(task_id=tid, robot_id="k_0", segment_index=0, success=False,
                                                error="forged")))
        ack_pub.publish([a for a in acks if a.task_id == tid][0])  # a replay of the fleet's own ack
        assert wait_until(lambda: planner.rejected.total >= 3, 10), planner.rejected.snapshot()
        counts = planner.rejected.snapshot()
        assert counts.get("report_fleet_key") == 2 and counts.get("ack_fleet_key") == 1, counts
        time.sleep(0.3)
        assert planner.core.result(tid).status is TaskStatus.DONE  # the forged failure revised nothing
    finally:
        planner.shutdown()
        spin.stop()
        ex.shutdown(timeout_sec=5)
        for node in (rogue, fleet, sched, planner):
            node.destroy_node()
        rclpy.shutdown(context=ctx)


def _plan(planner, robot_id: str) -> str:
    """One task for ``robot_id`` through the planner's own intake (what a goal does, without an action client)."""
    from timelyllm_ros.msg import TimeUtility

    acc = planner.intake.accept("fk-1", robot_id, "drone", "Scene: [] Task: [A] Could you find the cat?",
                                TimeUtility(level="normal"))
    return acc.task_id
