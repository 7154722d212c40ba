"""Test-wide settings: ROS traffic stays on this host, in a domain of its own."""

import os
import random

# Set before rclpy is imported anywhere: loopback-only discovery, and a domain
# that parallel test runs on the same machine are unlikely to share.
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
os.environ.setdefault("ROS_DOMAIN_ID", str(random.Random(os.getpid()).randint(1, 100)))
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
