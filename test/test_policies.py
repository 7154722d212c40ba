import math

import pytest

from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.domain.types import TaskSpec
from timelyllm_ros.planner.generation import Generation
from timelyllm_ros.planner.policies import POLICIES, RankContext, make_policy


def gen(level="normal", arrival=0.0, k=0, prev_end=math.nan, seq=0, tok=5.0, prefill=0.0, enq=None):
    g = Generation(TaskSpec(robot_id="r", prompt="p", tuf=LEVELS[level]), f"t{seq}", arrival, seq)
    g.k, g.prev_end, g.tok_est, g.prefill_est_s = k, prev_end, tok, prefill
    g.enqueued_at = arrival if enq is None else enq
    return g


CTX = RankContext(comm_s=0.008, per_token_s=0.02, slack_floor_s=0.001)


def test_pud_eq4_exact_first_segment():
    g = gen("urgent", arrival=0.0, tok=5, prefill=0.01)
    now = 0.05
    G = 5 * 0.02 + 0.01
    W = now - 0.0 + G + 0.008
    u = min(2.0, (-2 / 0.3) * (W - 0.2) + 2.0)
    L = 0.0 + 0.2 - now - G
    assert make_policy("pud").priority(g, now, CTX) == pytest.approx(u / (G * L))


def test_pud_eq4_exact_later_segment_and_floor():
    g = gen("normal", k=2, prev_end=10.0, tok=5)
    G = 0.1
    now = 9.5  # early: W = 0, TUF_1 = beta
    assert make_policy("pud").priority(g, now, CTX) == pytest.approx(1.0 / (G * (10.0 - now - G)))
    now = 10.05  # late: slack clamped to the floor, utility falls
    W = now + G + 0.008 - 10.0
    assert make_policy("pud").priority(g, now, CTX) == pytest.approx((1.0 - 2.0 * W) / (G * 0.001))


def test_pud_orders_urgent_first_and_hopeless_last():
    pud = make_policy("pud")
    normal, urgent = gen("normal", seq=0), gen("urgent", seq=1)
    hopeless = gen("urgent", arrival=-2.0, seq=2)  # its utility is negative whatever happens
    p = pud.priorities([normal, urgent, hopeless], 0.01, CTX)
    assert p[1] > p[0] > 0 > p[2]


def test_edf_fcfs_static_orderings():
    a = gen("normal", arrival=0.0, seq=0)
    b = gen("urgent", arrival=0.5, seq=1)  # deadline 0.7 < 1.0
    c = gen("normal", k=1, prev_end=0.6, arrival=-5, enq=0.55, seq=2)
    edf = make_policy("edf-seg").priorities([a, b, c], 0.56, CTX)
    assert edf[2] > edf[1] > edf[0]
    fcfs = make_policy("fcfs-seg").priorities([a, b, c], 0.56, CTX)
    assert fcfs[0] > fcfs[1] > fcfs[2]
    st = make_policy("static-priority").priorities([a, b], 0.56, CTX)
    assert st[1] > st[0]


def test_port_exp_formula():
    g = gen("normal", k=1, prev_end=1.0, tok=5)
    now = 0.5
    D = now + 0.1 + 0.008 - 1.0
    assert make_policy("port-exp").priority(g, now, CTX) == pytest.approx(1.0 * math.exp(D))


def test_registry_flags():
    assert set(POLICIES) >= {"pud", "fcfs", "fcfs-stream", "fcfs-seg", "edf-seg", "port-exp", "static-priority"}
    assert not make_policy("fcfs").segmented and not make_policy("fcfs").streams
    assert make_policy("fcfs-stream").streams and not make_policy("fcfs-stream").segmented
    assert make_policy("pud").segmented and make_policy("pud").streams
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("lifo")
