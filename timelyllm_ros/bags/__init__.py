"""Planner bags (rosbag2, MCAP storage) without rclpy: typestore, writer/reader, LRTrace converters, metrics.

Recording and replay on a live system are in ``timelyllm_ros.ros.recorder_node``
and ``timelyllm_ros.ros.replay_node``; the command line is ``timelyllm bags``
(:mod:`timelyllm_ros.ros.bag_cli`), or ``python -m timelyllm_ros.bags`` for the
commands that need no ROS (:func:`timelyllm_ros.bags.cli.main`). Nothing here
imports rclpy or ``timelyllm_ros.ros``.
"""

from .io import BagError, BagInfo, BagMessage, BagWriter, bag_info, read_bag
from .typestore import DEFAULT_TOPICS, TopicSpec, typestore

__all__ = ["DEFAULT_TOPICS", "BagError", "BagInfo", "BagMessage", "BagWriter", "TopicSpec", "bag_info", "read_bag",
           "typestore"]
