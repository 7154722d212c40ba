"""Thin ROS 2 layer over the core: nodes own parameters, topics, services and actions.

NODE_EXECUTABLES maps each installed executable (``ros2 run timelyllm_ros
<name>``; scripts in nodes/) to the function it runs.
"""

NODE_EXECUTABLES: dict[str, str] = {
    "planner_node": "timelyllm_ros.ros.planner_node:main",
    "exec_time_node": "timelyllm_ros.ros.exec_time_node:main",
    "sim_fleet_node": "timelyllm_ros.ros.sim_fleet_node:main",
    "plan_client": "timelyllm_ros.ros.client:main",
    "drone_executor_node": "timelyllm_ros.ros.drone_executor_node:main",
    "arm_executor_node": "timelyllm_ros.ros.arm_executor_node:main",
    "sim_arm_controller_node": "timelyllm_ros.ros.sim_arm_controller_node:main",
    "recorder_node": "timelyllm_ros.ros.recorder_node:main",
    "replay_node": "timelyllm_ros.ros.replay_node:main",
}
