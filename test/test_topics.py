"""Topic naming rules (ros/topics.py): a robot_id must name a valid segment topic; pure, no node started."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("rclpy")
from rclpy.exceptions import InvalidTopicNameException  # noqa: E402
from rclpy.validate_full_topic_name import validate_full_topic_name  # noqa: E402

from timelyllm_ros.ros.topics import TOPIC_MAX_LEN, robot_id_problem, segment_topic  # noqa: E402


@pytest.mark.parametrize("rid", ["drone_0", "_x", "A9", "fleet_a/drone_0", "a__b", "d" * 232])
def test_valid_robot_ids(rid):
    assert robot_id_problem(rid) is None


@pytest.mark.parametrize("rid, says", [
    ("drone-0", "'drone-0' has '-' at position 5: a ROS topic name takes only ASCII letters, digits, '_' and '/'"),
    ("1abc", "'1abc' starts with a digit; a name in a ROS topic starts with a letter or '_'"),
    ("fleet/2nd", "'2nd' starts with a digit"),
    ("drone 0", "has ' ' at position 5"),
    ("dröne", "has 'ö' at position 2"),
    ("~/x", "has '~' at position 0"),
    ("/drone", "must not start or end with '/' nor hold '//'"),
    ("a//b", "nor hold '//'"),
    ("drone/", "must not start or end with '/'"),
    ("", "must not be empty"),
    ("d" * 233, f"more than ROS allows ({TOPIC_MAX_LEN})"),
])
def test_invalid_robot_ids_name_the_rule(rid, says):
    problem = robot_id_problem(rid)
    assert problem is not None and says in problem, problem


@given(st.text(alphabet="ab_Z09/-~ ö{}", max_size=12) | st.just("x" * 232) | st.just("x" * 233))
def test_the_rule_agrees_with_rcl(rid):
    try:
        validate_full_topic_name(segment_topic(rid))
        rcl_ok = True
    except InvalidTopicNameException:
        rcl_ok = False
    assert (robot_id_problem(rid) is None) == rcl_ok, (rid, robot_id_problem(rid))
