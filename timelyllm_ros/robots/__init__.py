"""Robot side, pure Python (no rclpy): the MiniSpec interpreter that runs segments as they stream in, the
Tello (djitellopy) and arm backends and the declared stand-in perception. Delivery (the robot's inbox and
session) is ``transport/``.
"""
