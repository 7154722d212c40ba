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

import gc  # noqa: E402
import itertools  # noqa: E402
import weakref  # noqa: E402

import pytest  # noqa: E402
from colcon_ws import build_workspace  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# No timing in unit tests, hypothesis' included: its default 200 ms deadline per example failed
# test_hygiene under a CPU hog (one example took 1.1 s, then 0.2 ms on the rerun). Tests that set
# their own @settings inherit these.
settings.register_profile("timeless", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("timeless")

_BASE_DOMAIN = int(os.environ["ROS_DOMAIN_ID"])
_module_no = itertools.count()


@pytest.fixture(autouse=True, scope="module")
def _ros_domain_per_module():
    """Each test module gets a ROS domain of its own (rcl reads ROS_DOMAIN_ID when a context starts). Every
    test stack is a new DDS participant; one domain holding the participants (and any a failed test left
    behind) of a whole suite run slows discovery until a planner is no longer found in time."""
    old = os.environ["ROS_DOMAIN_ID"]
    os.environ["ROS_DOMAIN_ID"] = str((_BASE_DOMAIN + 7 * next(_module_no)) % 100 + 1)
    yield
    os.environ["ROS_DOMAIN_ID"] = old


_contexts: weakref.WeakSet = weakref.WeakSet()


def pytest_configure(config):
    try:
        from rclpy.context import Context
    except ImportError:  # the suite without ROS: those tests skip themselves
        return
    init = Context.init

    def _tracked_init(self, *args, **kwargs):
        _contexts.add(self)
        return init(self, *args, **kwargs)

    Context.init = _tracked_init


@pytest.fixture(autouse=True)
def _ros_participants_released():
    """The DDS participants of a test's contexts end with the test. rclpy's shutdown leaves a context's
    participant alive until the context is destroyed, which waits for the garbage collector: seen in
    test_planner_lifecycle, the six participants of the module's earlier tests still held ids 0-5 of its
    domain, and the test's probe and its planner subprocess (ids 6 and 7) never found each other in 120 s
    (about one module run in seven; never once they had been collected)."""
    yield
    ended = [c for c in list(_contexts) if not c.ok()]  # one still running belongs to a longer-lived fixture
    for ctx in ended:
        _contexts.discard(ctx)
        ctx.destroy()  # rclpy destroys it once its last node is gone
    if ended:
        gc.collect()  # nodes kept only by reference cycles (executors, callbacks)


@pytest.fixture(scope="session")
def colcon_ws(tmp_path_factory):
    """The package built in a fresh colcon workspace (test/colcon_ws.py), once for the session: test_colcon_build
    checks its install space, test_launch runs ``ros2 launch`` on it."""
    return build_workspace(tmp_path_factory.mktemp("colcon"))
