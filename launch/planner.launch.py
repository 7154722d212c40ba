"""ros2 launch timelyllm_ros planner.launch.py [config:=fleet_demo.yaml] [engine_config:=...] [policy:=...]
    [namespace:=...] [<node>.<parameter>:=<value> ...]

The planner stack only: planner (+ scheduler) and the execution-time model; `--show-args` lists the arguments.

The node list comes from timelyllm_ros.launch_graph.node_specs (tested), the
same function the `timelyllm` command uses.
"""

from timelyllm_ros.launch_graph import launch_description


def generate_launch_description():
    return launch_description(only=["planner", "exec_time"])
