"""Record the planner's traffic into a rosbag2 bag (MCAP storage) that standard ``ros2 bag`` reads.

    ros2 run timelyllm_ros recorder_node --ros-args -p output_dir:=bags
    ros2 service call /recorder/set_recording std_srvs/srv/SetBool "{data: false}"   # stop; "true" starts a new bag
    ros2 param set /recorder recording true

Topics (default): /plan_requests (every goal, accepted or refused), /plan_segments,
/segment_done, /scheduler_state and /engine_state (best effort). Messages are
written as received, serialized (raw subscriptions: no decode/encode), stamped
with the node clock at reception. Each start opens a new bag; its path is
logged, printed on stop, and published (latched) on ``~/bag_path``.

For the demo and tests: :func:`start_recorder` records on a node you already
spin, or on its own node and thread.
"""

from __future__ import annotations

import functools
import importlib
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import rclpy
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile
from std_msgs.msg import String
from std_srvs.srv import SetBool

from timelyllm_ros.bags.io import BagError, BagWriter
from timelyllm_ros.bags.typestore import DEFAULT_TOPICS, TopicSpec, topic_spec
from timelyllm_ros.ros.params import all_of, declare, non_empty, not_blank, refuse
from timelyllm_ros.ros.spin import Spinner, run_nodes
from timelyllm_ros.ros.topics import DEEP, LATCHED, RECORD_BEST_EFFORT


def default_bag_path(output_dir: str | Path = "bags", prefix: str = "timelyllm") -> Path:
    """``<output_dir>/<prefix>_<YYYYmmdd-HHMMSS>`` (a suffix is added if that exists)."""
    base = Path(output_dir) / f"{prefix}_{time.strftime('%Y%m%d-%H%M%S')}"
    p, i = base, 1
    while p.exists():
        p, i = base.with_name(f"{base.name}_{i}"), i + 1
    return p


def get_message(msgtype: str) -> type:
    """``pkg/msg/Type`` -> the rclpy message class (rosidl_runtime_py is not in every environment)."""
    pkg, kind, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.{kind}"), name)


def _sub_qos(spec: TopicSpec) -> QoSProfile:
    # Deep reliable queues: a burst of segments must not be dropped while the bag writes.
    return DEEP if spec.reliable else RECORD_BEST_EFFORT


class BagRecorder:
    """Raw subscriptions on ``node`` (which the caller spins) that feed a bag between start() and stop()."""

    def __init__(self, node: Node, topics: Iterable[TopicSpec] = DEFAULT_TOPICS) -> None:
        self.node = node
        self.topics = list(topics)
        self._writer: BagWriter | None = None
        self._lock = threading.Lock()
        self.last_path: Path | None = None
        group = MutuallyExclusiveCallbackGroup()  # one writer thread: arrival order = file order
        # partial, not a 2-argument lambda: rclpy would pass MessageInfo as the second argument
        self._subs = [node.create_subscription(get_message(t.msgtype), t.name, functools.partial(self._on_msg, t.name),
                                               _sub_qos(t), raw=True, callback_group=group)
                      for t in self.topics]

    @property
    def recording(self) -> bool:
        return self._writer is not None

    @property
    def path(self) -> Path | None:
        """The bag being written, else the last one closed."""
        w = self._writer
        return w.path if w is not None else self.last_path

    @property
    def counts(self) -> dict[str, int]:
        w = self._writer
        return dict(w.counts) if w is not None else {}

    def _on_msg(self, topic: str, data: bytes) -> None:
        w = self._writer
        if w is None:
            return
        try:
            w.write_raw(topic, data)
        except BagError:  # closed between the check and the write: the message is after stop()
            pass

    def start(self, path: str | Path, custom_data: dict[str, str] | None = None) -> Path:
        """Open a new bag at ``path`` (must not exist); returns it."""
        with self._lock:
            if self._writer is not None:
                raise BagError(f"already recording to {self._writer.path}")
            clock = self.node.get_clock()
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._writer = BagWriter(path, self.topics, custom_data=custom_data,
                                     clock_ns=lambda: clock.now().nanoseconds)
            return self._writer.path

    def stop(self) -> Path | None:
        """Close the bag (index, footer, metadata.yaml); returns its path (None if not recording)."""
        with self._lock:
            w, self._writer = self._writer, None
            if w is None:
                return None
            self.last_path = w.close()
            return self.last_path

    def wait_ready(self, timeout: float = 5.0) -> bool:
        """Wait until every publisher now in the graph on our topics is matched (so nothing early is lost)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(s.get_publisher_count() >= self.node.count_publishers(s.topic_name) for s in self._subs):
                return True
            time.sleep(0.02)
        return False

    def destroy(self) -> None:
        self.stop()
        for s in self._subs:
            self.node.destroy_subscription(s)
        self._subs = []


def _new_path(path: str) -> str | None:
    return f"{path} exists already" if path and Path(path).exists() else None


def _known_topics(names: list[str]) -> str | None:
    try:
        for n in names:
            topic_spec(n)
    except ValueError as e:
        return str(e)
    return None


class RecorderNode(Node):
    """The recorder as a node: parameters ``recording``, ``output_dir`` and ``bag_path`` (settable at run time;
    the last two apply to the next bag) and ``topics`` (read-only)."""

    def __init__(self, node_name: str = "recorder", **kw: Any) -> None:
        super().__init__(node_name, **kw)
        self._output_dir = declare(self, "output_dir", "bags", "folder for new bags (named timelyllm_<date>-<time>)",
                                   check=not_blank, constraints="not empty ('.' = the working folder)")
        self._next_path = declare(self, "bag_path", "", "exact path of the next bag (must not exist); "
                                  "'' = a new name in output_dir", check=_new_path, constraints="a new path")
        names = list(declare(self, "topics", [t.name for t in DEFAULT_TOPICS], "topics to record (known planner "
                             "topics); fixed at start-up", read_only=True, check=all_of(non_empty, _known_topics),
                             constraints="known planner topics"))
        topics = [topic_spec(n) for n in names]
        want = declare(self, "recording", True, "true records, false stops (each start opens a new bag)")
        self.recorder = BagRecorder(self, topics)
        self._path_pub = self.create_publisher(String, "~/bag_path", LATCHED)
        self.create_service(SetBool, "~/set_recording", self._set_recording_srv)
        self.add_on_set_parameters_callback(self._check_params)
        self.add_post_set_parameters_callback(self._apply_params)
        if want:
            self._start()

    def _start(self) -> Path:
        path = Path(self._next_path) if self._next_path else default_bag_path(self._output_dir)
        self._next_path = ""
        p = self.recorder.start(path)
        self.get_logger().info(f"recording {[t.name for t in self.recorder.topics]} to {p}")
        self._path_pub.publish(String(data=str(p)))
        return p

    def _stop(self) -> Path | None:
        counts = self.recorder.counts
        p = self.recorder.stop()
        if p is not None:
            text = f"bag closed: {p} ({sum(counts.values())} messages: {counts})"
            if self.context.ok():
                self.get_logger().info(text)
            else:  # after Ctrl-C the context is gone and rosout with it
                print(text, flush=True)
        return p

    def _check_params(self, params: list[Parameter]) -> SetParametersResult:
        """Starting a bag at ``bag_path`` (checked again: the path may have appeared since it was set)."""
        for p in params:
            if p.name == "recording" and p.value and not self.recorder.recording and self._next_path \
                    and Path(self._next_path).exists():
                return refuse("bag_path", f"{self._next_path} exists already")
        return SetParametersResult(successful=True)

    def _apply_params(self, params: list[Parameter]) -> None:
        for p in params:
            if p.name == "output_dir":
                self._output_dir = p.value
            elif p.name == "bag_path":
                self._next_path = p.value
            elif p.name == "recording":
                if p.value and not self.recorder.recording:
                    self._start()
                elif not p.value and self.recorder.recording:
                    self._stop()

    def _set_recording_srv(self, req: SetBool.Request, resp: SetBool.Response) -> SetBool.Response:
        was = self.recorder.recording
        try:
            res = self.set_parameters([Parameter("recording", value=bool(req.data))])[0]
        except BagError as e:
            res = SetParametersResult(successful=False, reason=str(e))
        if not res.successful:
            resp.success, resp.message = False, res.reason
            return resp
        resp.success = True
        path = self.recorder.path
        resp.message = str(path) if path is not None else ""
        if was == bool(req.data):
            resp.message = f"{'already' if was else 'not'} recording; bag: {resp.message or '-'}"
        return resp

    def destroy_node(self) -> None:
        p = self._stop()
        if p is not None:
            print(f"bag: {p}", flush=True)
        super().destroy_node()


class RecorderHandle:
    """What :func:`start_recorder` returns: ``path``, ``counts``, ``stop() -> Path``."""

    def __init__(self, recorder: BagRecorder, cleanup) -> None:  # noqa: ANN001 - private callback
        self._recorder = recorder
        self._cleanup = cleanup
        self.path: Path = recorder.path  # type: ignore[assignment]
        self._stopped = False

    @property
    def counts(self) -> dict[str, int]:
        return self._recorder.counts

    def wait_ready(self, timeout: float = 5.0) -> bool:
        return self._recorder.wait_ready(timeout)

    def stop(self) -> Path:
        """Close the bag and remove the subscriptions (and the own node, if any); idempotent."""
        if not self._stopped:
            self._stopped = True
            self._recorder.destroy()
            self._cleanup()
        return self.path


def start_recorder(node_or_context: Node | Context | None, path: str | Path,
                   topics: Iterable[TopicSpec] = DEFAULT_TOPICS, *, wait_s: float = 2.0) -> RecorderHandle:
    """Start recording the planner topics into a new bag at ``path``.

    ``node_or_context``: a Node that the caller's executor spins (subscriptions
    are added to it), or an rclpy Context (None: the default) in which a
    private recorder node is spun by its own thread. Waits up to ``wait_s``
    for the existing publishers to match, so the first messages are kept.
    """
    if isinstance(node_or_context, Node):
        rec = BagRecorder(node_or_context, topics)
        rec.start(path)
        handle = RecorderHandle(rec, lambda: None)
    else:
        node = rclpy.create_node(f"timelyllm_recorder_{int(time.time() * 1000) % 10**8}", context=node_or_context)
        ex = SingleThreadedExecutor(context=node_or_context)
        ex.add_node(node)
        thread = Spinner(ex, name="timelyllm-recorder")
        rec = BagRecorder(node, topics)
        rec.start(path)
        thread.start()

        def cleanup() -> None:
            ex.shutdown(timeout_sec=2)
            node.destroy_node()
            thread.join(timeout=2)

        handle = RecorderHandle(rec, cleanup)
    rec.wait_ready(wait_s)
    return handle


def main(args: list[str] | None = None) -> int:
    return run_nodes(lambda: [RecorderNode()], args)


if __name__ == "__main__":
    import sys

    sys.exit(main())


__all__ = ["BagRecorder", "RecorderHandle", "RecorderNode", "default_bag_path", "main", "start_recorder"]
