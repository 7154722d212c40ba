"""One way to run a process's nodes until Ctrl-C / SIGTERM, shared by every executable."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions


def run_nodes(build: Callable[[], Sequence[Node]], args: list[str] | None = None, *, num_threads: int = 1,
              before_destroy: Callable[[Sequence[Node]], None] | None = None) -> int:
    """rclpy.init, build the nodes, spin them until SIGINT / SIGTERM / shutdown, then tear everything down.

    ``before_destroy`` runs first on the way out, while the context is still valid, so that it can still
    answer open goals and publish final results. That is why rclpy's own signal handlers are off here: they
    shut the context down *before* our code runs, and every last publish would then fail.
    """
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    nodes: Sequence[Node] = ()
    ex = SingleThreadedExecutor() if num_threads <= 1 else MultiThreadedExecutor(num_threads=num_threads)
    try:
        nodes = build()
        for n in nodes:
            ex.add_node(n)
        while not stop.is_set() and rclpy.ok():
            ex.spin_once(timeout_sec=0.2)  # bounded waits: a signal is seen within 0.2 s
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if before_destroy is not None and nodes:
            before_destroy(nodes)
            # What before_destroy queued on the executor (e.g. final action results) still goes out.
            end = time.monotonic() + 2.0
            while rclpy.ok() and time.monotonic() < end:
                ex.spin_once(timeout_sec=0.05)
        ex.shutdown(timeout_sec=5)
        for n in reversed(nodes):
            n.destroy_node()
        rclpy.try_shutdown()
    return 0
