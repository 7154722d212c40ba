"""Pure-Python core: math, policies, grammar, models, simulator. Never imports rclpy."""
