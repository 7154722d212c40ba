"""One way to run a process's nodes until Ctrl-C, shared by every executable."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.node import Node


def run_nodes(build: Callable[[], Sequence[Node]], args: list[str] | None = None, *, num_threads: int = 1,
              before_destroy: Callable[[Sequence[Node]], None] | None = None) -> int:
    """rclpy.init, build the nodes, spin them until Ctrl-C / shutdown, then tear everything down.

    ``before_destroy`` runs first on the way out (e.g. to answer open goals while the nodes still exist).
    """
    rclpy.init(args=args)
    nodes: Sequence[Node] = ()
    ex = SingleThreadedExecutor() if num_threads <= 1 else MultiThreadedExecutor(num_threads=num_threads)
    try:
        nodes = build()
        for n in nodes:
            ex.add_node(n)
        ex.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if before_destroy is not None and nodes:
            before_destroy(nodes)
            # What before_destroy queued on the executor (e.g. final action results) still goes out.
            for _ in range(20):
                if rclpy.ok():
                    ex.spin_once(timeout_sec=0.05)
        ex.shutdown(timeout_sec=5)
        for n in reversed(nodes):
            n.destroy_node()
        rclpy.try_shutdown()
    return 0
