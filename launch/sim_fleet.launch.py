"""ros2 launch timelyllm_ros sim_fleet.launch.py [config:=fleet_demo.yaml] [namespace:=...]
    [sim_fleet.<parameter>:=<value> ...]

The simulated robots only; `--show-args` lists the arguments.

The node list comes from timelyllm_ros.launch_graph.node_specs (tested), the
same function the `timelyllm` command uses.
"""

from timelyllm_ros.launch_graph import launch_description


def generate_launch_description():
    return launch_description(only=["sim_fleet"])
