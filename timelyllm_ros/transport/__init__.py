"""Delivery of plan segments, both halves, without ROS: the planner's (re-sends until acknowledged) and the
robot's (inbox: dedup, order, hold; one session per robot). The ROS nodes carry the messages."""
