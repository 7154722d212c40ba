"""Real vLLM (vllm or vllm-cpu) with the bundled SmolLM2-135M model (issue 4 §5).

Slow: deselect locally with ``-m "not engine"``. The engine is loaded once per module.
"""

from __future__ import annotations

import json
import os

import pytest

from timelyllm_ros.core.engine import EngineRequest, FinishReason, concat_segments
from timelyllm_ros.core.segmenter import make_stop_checker
from timelyllm_ros.engines import driver
from timelyllm_ros.engines.factory import _REPO, make_engine
from timelyllm_ros.engines.prompts import PromptBuilder

pytestmark = pytest.mark.engine
pytest.importorskip("vllm")

CFG = os.environ.get("TIMELYLLM_ENGINE_CONFIG", "config/engine_vllm_cpu.yaml")
CAT = "Scene: [] Task: [A] Could you find the cat? If so, go to it."
BOY = ("Scene: [boy x:0.48 y:0.51 width:0.2 height:0.4] Task: [E] You provided me with plan mf,100, but I "
       "encountered a failure because a boy is passing by. Execution history: mf(50)")


@pytest.fixture(scope="module")
def eng():
    e = make_engine(CFG)
    yield e
    e.close()


@pytest.fixture(scope="module")
def pb(eng):
    return PromptBuilder(eng.tokenizer, "drone")


def _req(pb, gid, task=CAT, **kw):
    return EngineRequest(gid, pb.token_ids(task), make_stop_checker(pb.skillset), max_new_tokens=48, **kw)


def test_smoke_greedy_and_prefix_cache(eng, pb):
    """Foundation smoke test: greedy few-shot MiniSpec plan, then a prompt that extends it hits the cache."""
    ids = pb.token_ids(CAT)
    r1 = _req(pb, "smoke1", suspend_at_boundary=False)
    ev = driver.run(eng, [r1])["smoke1"]
    assert ev[-1].reason is FinishReason.STOP
    text = eng.decode(r1.output_token_ids)
    assert pb.skillset.parse(text, complete=True), text
    r2 = EngineRequest("smoke2", ids + r1.output_token_ids, make_stop_checker(pb.skillset), max_new_tokens=4)
    ev2 = driver.run(eng, [r2])["smoke2"]
    assert ev2[0].cached_prompt_tokens > 0
    assert eng.submissions[-1]["cached_tokens"] >= (len(ids) // eng.block_size) * eng.block_size


@pytest.mark.parametrize("constrained", [False, True])
def test_drone_prompt_segments_parse(eng, pb, constrained):
    extra = {"regex": pb.regex} if constrained else {}
    r = _req(pb, f"seg-{constrained}", extra=extra)
    ev = driver.run(eng, [r])[r.gen_id]
    segs = [e for e in ev if e.reason is FinishReason.SEGMENT]
    assert len(segs) >= 2, [e.text for e in ev]
    for e in segs:
        assert e.suspended
        assert pb.skillset.parse(e.text), e.text  # every segment holds a valid skill call
    plan = concat_segments(ev)
    assert plan == eng.decode(r.output_token_ids)
    assert pb.skillset.validate(plan, complete=True) is None


@pytest.mark.parametrize("task", [CAT, BOY])
def test_segmentation_does_not_change_plan(eng, pb, task):
    seg = _req(pb, f"s-{task[:20]}", task=task)
    whole = _req(pb, f"w-{task[:20]}", task=task, suspend_at_boundary=False)
    ev_s = driver.run(eng, [seg])[seg.gen_id]
    ev_w = driver.run(eng, [whole])[whole.gen_id]
    assert seg.output_token_ids == whole.output_token_ids
    assert [e.text for e in ev_s] == [e.text for e in ev_w]
    assert sum(e.suspended for e in ev_s) >= 1 and not any(e.suspended for e in ev_w)


def test_resume_reuses_prefix_cache(eng, pb):
    r = _req(pb, "resume")
    n_prompt = len(r.prompt_token_ids)
    ev = driver.run(eng, [r])["resume"]
    resumed = ev[1:]  # events after the first suspension come from resubmissions
    assert resumed and all(e.cached_prompt_tokens > 0 for e in resumed)
    # The whole prompt (full blocks) and the plan so far come from the cache, not a re-prefill.
    subs = [s for s in eng.submissions if s["gen_id"] == "resume"][1:]
    for s in subs:
        assert s["cached_tokens"] >= (n_prompt // eng.block_size) * eng.block_size
        assert s["prompt_tokens"] - s["cached_tokens"] <= eng.block_size


def test_abort_frees_request(eng, pb):
    r = _req(pb, "abort-me", suspend_at_boundary=False)
    eng.add(r)
    eng.step()
    eng.step()
    assert eng.backend_has_request("abort-me")
    eng.abort("abort-me")
    assert not eng.backend_has_request("abort-me")
    st = eng.stats()
    assert (st.running, st.waiting) == (0, 0)
    assert not eng.has_work()
    eng.abort("abort-me")  # idempotent


def test_suspended_holds_no_slot_while_other_decodes(eng, pb):
    a = _req(pb, "conc-a")  # suspends at its first boundary and is not resumed
    b = _req(pb, "conc-b", task=BOY, suspend_at_boundary=False)
    eng.add(a)
    eng.add(b)
    suspended = False
    b_tokens_after = 0
    for _ in range(200):
        if not eng.has_work():
            break
        rep = eng.step()
        if any(e.gen_id == "conc-a" and e.suspended for e in rep.events):
            suspended = True
            continue
        if suspended:
            assert "conc-a" not in eng.running_ids()
            assert not eng.backend_has_request("conc-a")  # no vLLM request, no batch slot
            assert eng.backend_running_ids() <= {"conc-b"}
            assert rep.batch_size == 1
            b_tokens_after += rep.new_tokens
    assert suspended and b_tokens_after >= 3
    # resuming a continues the plan where it stopped
    ev = driver.run(eng, [a])["conc-a"]
    assert ev[-1].final


def test_lrtrace_tasks_all_parse_constrained(eng, pb):
    jobs = json.loads((_REPO / "data/lrtrace/drone-wid2/jobs.json").read_text())
    tasks = {}
    for j in jobs:
        tasks.setdefault(j["trace_id"], j["task_input"])
    reqs = [_req(pb, f"trace-{t}", task=x, extra={"regex": pb.regex}) for t, x in sorted(tasks.items())]
    events = driver.run(eng, reqs)  # 8 concurrent generations, suspended and resumed
    for r in reqs:
        plan = concat_segments(events[r.gen_id])
        assert pb.skillset.validate(plan, complete=True) is None, plan
