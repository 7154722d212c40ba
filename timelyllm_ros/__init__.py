"""timelyllm_ros: a time-sensitive, segmented LLM task planner for robot fleets.

Everything but ``timelyllm_ros.ros`` is pure Python (no rclpy); ``timelyllm_ros.engines``
holds the real LLM backends; ``timelyllm_ros.ros`` the thin ROS 2 nodes.
"""

from pkgutil import extend_path

# The generated msg/srv/action modules live in install/ while the Python
# sources may be used from the checkout: merge both into one package.
__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"
