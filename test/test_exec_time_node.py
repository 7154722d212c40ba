"""The exec_time node over real rclpy (loopback DDS): it learns from SegmentDone and never stops answering."""

from __future__ import annotations

import threading

import pytest
from waiting import wait_until

rclpy = pytest.importorskip("rclpy")
from timelyllm_ros.msg import PlanSegment, SegmentDone, SkillCall  # noqa: E402
from timelyllm_ros.ros.convert import skill_call_msg, time_msg  # noqa: E402
from timelyllm_ros.ros.exec_time_node import ExecTimeNode  # noqa: E402
from timelyllm_ros.ros.spin import PooledExecutor  # noqa: E402
from timelyllm_ros.ros.topics import ALL_SEGMENTS as ALL_SEGMENTS_TOPIC  # noqa: E402
from timelyllm_ros.ros.topics import RELIABLE  # noqa: E402
from timelyllm_ros.skills.skill_files import load_skill_set  # noqa: E402
from timelyllm_ros.srv import EstimateExecTime  # noqa: E402

pytestmark = pytest.mark.ros

DRONE = load_skill_set("drone")


class Harness:
    """An ExecTimeNode, and a peer node that plays planner (segments) and robot (SegmentDone)."""

    def __init__(self) -> None:
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx)
        self.node = ExecTimeNode(context=self.ctx)
        self.peer = rclpy.create_node("exec_time_test_peer", context=self.ctx)
        self.segments = self.peer.create_publisher(PlanSegment, ALL_SEGMENTS_TOPIC, RELIABLE)
        self.done = self.peer.create_publisher(SegmentDone, "/segment_done", RELIABLE)
        self.cli = self.peer.create_client(EstimateExecTime, "/estimate_exec_time")
        self.ex = PooledExecutor(num_threads=4, context=self.ctx)
        self.ex.add_node(self.node)
        self.ex.add_node(self.peer)
        self.spin_error: BaseException | None = None
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()
        assert wait_until(lambda: self.segments.get_subscription_count() and self.done.get_subscription_count(), 20)
        assert self.cli.wait_for_service(timeout_sec=10)

    def _spin(self) -> None:
        try:
            self.ex.spin()
        except BaseException as e:  # a callback raised: the executor stops serving the node
            self.spin_error = e

    def estimate(self, robot_type: str, text: str) -> EstimateExecTime.Response:
        fut = self.cli.call_async(EstimateExecTime.Request(robot_type=robot_type, segment_text=text))
        assert wait_until(fut.done, 10), f"no answer to EstimateExecTime (spin error: {self.spin_error!r})"
        return fut.result()

    def publish_segment(self, task: str, index: int, text: str, skills: list[SkillCall], final: bool = False) -> None:
        n = self.node.stats["segments"]
        self.segments.publish(PlanSegment(task_id=task, robot_id="drone_0", segment_index=index, text=text,
                                          skills=skills, is_final=final))
        assert wait_until(lambda: self.node.stats["segments"] > n), "the node never got the segment"

    def report_done(self, task: str, index: int, took_s: float, success: bool = True) -> None:
        n = sum(self.node.stats[k] for k in ("learned", "unmatched", "skipped", "failed"))
        self.done.publish(SegmentDone(task_id=task, robot_id="drone_0", segment_index=index, start=time_msg(100.0),
                                      finish=time_msg(100.0 + took_s), success=success))
        assert wait_until(lambda: sum(self.node.stats[k] for k in ("learned", "unmatched", "skipped", "failed")) > n)

    def close(self) -> None:
        self.ex.shutdown(timeout_sec=5)
        self.node.destroy_node()
        self.peer.destroy_node()
        rclpy.shutdown(context=self.ctx)
        self.thread.join(timeout=5)


@pytest.fixture()
def h():
    harness = Harness()
    yield harness
    harness.close()


def _skills(text: str) -> list[SkillCall]:
    return [skill_call_msg(c, DRONE.id) for c in DRONE.parse(text)]


def test_segments_without_skills_are_ignored_and_the_node_keeps_answering(h):
    h.publish_segment("t1", 1, "};", [], final=True)  # syntax-only remainder of a plan
    h.publish_segment("t1", 2, "", [], final=True)  # end-of-plan marker
    h.report_done("t1", 1, 2.0)
    h.report_done("t1", 2, 0.1)
    assert h.node.stats["segments_without_skills"] == 2 and h.node.stats["unmatched"] == 2
    # a skill set nobody knows: logged, not learned, not raised
    bogus = [SkillCall(name="mf", long_name="move_forward", raw="mf(50)", args=["50"], skillset_id="no_such_set")]
    h.publish_segment("t2", 0, "mf(50)", bogus)
    h.report_done("t2", 0, 2.0)
    assert h.node.stats["failed"] == 1 and h.node.stats["learned"] == 0
    r = h.estimate("drone", "mf(50)")
    assert r.ok, r.error
    assert r.min_s <= r.typical_s <= r.max_s and r.typical_s > 0
    assert h.spin_error is None


def test_a_reported_skill_segment_changes_the_estimate(h):
    before = h.estimate("drone", "mf(50)")
    assert before.ok, before.error
    h.publish_segment("t3", 0, "mf(50)", _skills("mf(50)"))  # SkillCall.skillset_id is "drone_minispec"
    h.report_done("t3", 0, 3 * before.typical_s)  # the robot is three times slower than modelled
    assert h.node.stats["learned"] == 1
    after = h.estimate("drone", "mf(50)")
    assert after.ok, after.error
    # one-skill segment: factor 1 + alpha * (observed - predicted) / modelled = 1 + 0.2 * 2
    assert after.typical_s == pytest.approx(1.4 * before.typical_s)
    # the skill set id and the robot type name the same model
    assert h.estimate("drone_minispec", "mf(50)").typical_s == pytest.approx(after.typical_s)
    # a failed segment teaches nothing
    h.publish_segment("t3", 1, "mf(50)", _skills("mf(50)"))
    h.report_done("t3", 1, 100.0, success=False)
    assert h.node.stats["skipped"] == 1
    assert h.estimate("drone", "mf(50)").typical_s == pytest.approx(after.typical_s)
    assert h.spin_error is None
