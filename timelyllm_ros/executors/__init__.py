"""Skill executors: turn validated skill calls into robot commands (pure Python, no rclpy).

* :mod:`.minispec_interpreter` runs MiniSpec segments as they stream in;
* :mod:`.tello_backend` drives a Tello through djitellopy;
* :mod:`.tello_emulator` is a Tello SDK UDP server for tests and the demo;
* :mod:`.netns` puts emulated drones in network namespaces (djitellopy's fixed ports);
* :mod:`.perception` is the declared, replaceable stand-in detector;
* :mod:`.arm_backend` turns arm skills into joint trajectories.
"""
