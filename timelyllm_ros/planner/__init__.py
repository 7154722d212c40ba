"""The planner without ROS: PlannerCore (``core.py``: TUF/PUD ranking and stepping of generations) and the
modules of each concern beside it, the policies and admission, and PlannerService (``service.py``: what the
planner node does, without ROS). Drives an :class:`timelyllm_ros.engines.base.Engine`.
"""
