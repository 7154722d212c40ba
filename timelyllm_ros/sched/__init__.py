"""The planner core: TUF/PUD scheduling of generations, policies, admission and its latency
estimate, the result journal and request hygiene. Pure Python (no rclpy); drives an
:class:`timelyllm_ros.engines.base.Engine`.
"""
