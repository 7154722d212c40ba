"""Generation (planner/generation.py) owns what is computed from a generation's state: the next segment's
generation time G, its wait, slack and resume time, and its status transitions. No other module recomputes G."""

import ast
import math
from pathlib import Path

import pytest

from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.domain.types import Segment, TaskSpec, TaskStatus
from timelyllm_ros.planner.generation import Generation

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / "timelyllm_ros" / "planner" / "generation.py"
TOKEN_ESTIMATES = {"tok_est", "rem_tok_est"}  # tokens: times a step time is a generation time
PREFILL = "prefill_est_s"  # seconds: added to a generation time is G with its prefill


def _reads(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in names for n in ast.walk(node))


def g_recomputations(tree: ast.AST) -> list[int]:
    """Lines where a token estimate is multiplied (G, or the time left of a segment or plan), or the prefill
    estimate is added to something: what Generation.gen_time and its siblings compute."""
    lines = []
    for n in ast.walk(tree):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and (
                _reads(n.left, TOKEN_ESTIMATES) or _reads(n.right, TOKEN_ESTIMATES)):
            lines.append(n.lineno)
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and (
                _reads(n.left, {PREFILL}) or _reads(n.right, {PREFILL})):
            lines.append(n.lineno)
        elif isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add | ast.Mult) and _reads(
                n.value, TOKEN_ESTIMATES | {PREFILL}):
            lines.append(n.lineno)
    return lines


def test_the_check_finds_each_form_g_took_before():
    for src in ("G = g.tok_est * ctx.per_token_s", "G = q.tok_est * step + (q.prefill_est_s if q.k == 0 else 0.0)",
                "x = until + g.prefill_est_s + g.tok_est * step1_s", "t = now + max(1.0, g.tok_est - n) * step",
                "G += g.prefill_est_s"):
        assert g_recomputations(ast.parse(src)), src
    assert not g_recomputations(ast.parse("G = g.gen_time(step)\nextra = max(0.0, c.prefill_est_s - fixed)"))


def test_no_module_but_generation_recomputes_g():
    found = []
    for py in sorted([*(ROOT / "timelyllm_ros").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        if py == HOME:
            continue
        found += [f"{py.relative_to(ROOT)}:{line}" for line in g_recomputations(ast.parse(py.read_text()))]
    assert not found, f"G recomputed outside planner/generation.py (call Generation.gen_time): {found}"


def gen(level="normal", arrival=10.0, k=0, prev_end=math.nan, tok=5.0, prefill=0.25) -> Generation:
    g = Generation(TaskSpec(robot_id="r", prompt="p", tuf=LEVELS[level]), "t", arrival, 0)
    g.k, g.prev_end, g.tok_est, g.prefill_est_s = k, prev_end, tok, prefill
    return g


def test_gen_time_counts_the_prefill_of_a_first_segment_only_when_asked():
    g = gen()
    assert g.gen_time(0.02) == 5.0 * 0.02 + 0.25
    assert g.gen_time(0.02, prefill=False) == 5.0 * 0.02
    later = gen(k=1, prev_end=12.0)
    assert later.gen_time(0.02) == later.gen_time(0.02, prefill=False) == 5.0 * 0.02


def test_wait_and_slack_of_a_first_and_a_later_segment():
    g = gen(arrival=10.0)
    G = g.gen_time(0.02)
    assert g.wait(11.0, G, 0.008) == 11.0 - 10.0 + G + 0.008
    assert g.slack(11.0, G) == g.tuf.deadline(0, 10.0, math.nan) - 11.0 - G
    later = gen(k=2, prev_end=12.0)
    assert later.wait(11.0, 0.1, 0.008) == 11.0 + 0.1 + 0.008 - 12.0  # early: negative
    assert later.slack(11.0, 0.1) == later.deadline() - 11.0 - 0.1 == 12.0 - 11.0 - 0.1


def test_segment_and_plan_left_count_at_least_a_token():
    g = gen(tok=5.0)
    g.rem_tok_est = 20.0
    assert g.tokens_left() == 5.0 and g.segment_left_s(0.1) == 5.0 * 0.1 and g.plan_left_s(0.1) == 20.0 * 0.1
    g.tok_est = 0.5
    assert g.tokens_left() == 1.0


def _seg(i: int, end: float | None) -> Segment:
    s = Segment(index=i, text="x;", token_ids=[1], calls=[], gen_start=0.0, ready=0.0)
    s.pred_end = end
    return s


def test_suspend_and_its_resume_time_after_the_segment_before_ends():
    g = gen(tok=4.0)
    g.status = TaskStatus.RUNNING
    g.segments = [_seg(0, 20.0)]
    g.suspend()
    assert g.status is TaskStatus.SUSPENDED and g.k == 1
    at = g.resume_time(15.0, 0.5, 0.1, 0.2)
    assert g.prev_end == 20.0 and at == g.eligible_at == 20.0 - 4.0 * 0.5 - 0.1 - 0.2  # no prefill: k > 0
    g.segments.append(_seg(1, None))  # held, not sent: it resumes at once
    g.suspend()
    assert g.resume_time(16.0, 0.5, 0.1, 0.2) == 16.0 - 2.0 - 0.1 - 0.2 and g.prev_end == 16.0


def test_transitions_start_stream_on_abort_and_end():
    g = gen()
    g.start(3.0)
    assert g.status is TaskStatus.RUNNING and g.gen_start == 3.0
    g.req = g.engine_request([1, 2], True, None, output=[7, 8, 9])
    g.begin_segment()
    assert g.seg_start_len == 3 and g.seg_tokens() == 0
    g.req.output_token_ids += [10, 11]
    assert g.seg_tokens() == 2
    g.segments = [_seg(0, 9.0)]
    g.stream_on()
    assert (g.k, g.prev_end, g.seg_tokens(), g.status) == (1, 9.0, 0, TaskStatus.RUNNING)
    g.abort_later("robot gone", TaskStatus.ROBOT_FAILED)
    g.abort_later("cancelled by client")  # keeps how it ends
    assert g.pending_abort and g.reason == "cancelled by client" and g.abort_status is TaskStatus.ROBOT_FAILED
    v = g.wait_version
    g.end(TaskStatus.CANCELLED, "why")
    assert (g.status, g.reason, g.wait_version) == (TaskStatus.CANCELLED, "why", v + 1)


def test_result_predicts_the_response_time_from_the_first_dispatch():
    g = gen(arrival=10.0)
    assert g.result(0.008).response_time is None
    s = _seg(0, 13.0)
    s.dispatch = 11.0
    g.segments = [s]
    g.end(TaskStatus.DONE, "")
    res = g.result(0.008)
    assert res.response_time == pytest.approx(1.008) and res.utility == g.tuf.tuf0(res.response_time)
    assert res.plan == "x;" and res.status is TaskStatus.DONE
