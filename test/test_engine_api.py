"""What every engine declares (EngineInfo), the one engine factory, prompt rendering per engine, and the
core's warm-up. No weights, no ROS: a scripted backend stands in for a real engine."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml

from timelyllm_ros import paths
from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.engines import factory
from timelyllm_ros.engines.base import (
    Engine,
    EngineInfo,
    EngineRequest,
    EngineStats,
    FinishReason,
    RawTokens,
    SubmissionLog,
)
from timelyllm_ros.engines.factory import (
    EngineConfigError,
    constrained_decoding,
    find_engine_config,
    load_engine_config,
    load_step_model,
    make_engine,
    planner_engine,
)
from timelyllm_ros.engines.prompts import PromptRenderer, TaskPromptError
from timelyllm_ros.engines.sim_engine import SimEngine, SimEngineConfig
from timelyllm_ros.engines.sim_realtime import RealtimeSimEngine, sim_plan_for
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.policies import make_policy
from timelyllm_ros.planner.warmup import warm_up
from timelyllm_ros.skills.segmenter import StopChecker, make_stop_checker

CAT = "Scene: [] Task: [A] Could you find the cat? If so, go to it."


class _CharTokenizer:
    """Chat template and tokenizer of a real backend, one token per character."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


class _ScriptedEngine(Engine):
    """A 'real' backend (a prompt, no plan text) writing ``mf(50);`` one piece per step; records requests."""

    PIECES = ["mf", "(", "50", ")", ";"]

    def __init__(self, max_model_len: int | None = None, max_batch: int = 4) -> None:
        super().__init__()
        self.info = EngineInfo("scripted", "models/scripted", max_model_len=max_model_len)
        self.tokenizer = _CharTokenizer()
        self.max_batch = max_batch
        self.requests: list[EngineRequest] = []
        self.steps = 0

    def _backend_add(self, req: EngineRequest) -> None:
        self.requests.append(req)

    def _backend_step(self):
        self.steps += 1
        out = []
        for gid in self.running_ids():
            n = len(self._live[gid].req.output_token_ids)
            out.append(RawTokens(gid, [n], [self.PIECES[n % len(self.PIECES)]]))
        return out, 0.01, 0

    def _backend_suspend(self, gen_id: str) -> None:
        pass

    def _backend_abort(self, gen_id: str) -> None:
        pass

    def stats(self) -> EngineStats:
        return EngineStats(len(self.running_ids()), 0, 0.0, 0.0, 0.0, self.max_batch)

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)


# -- EngineInfo ------------------------------------------------------------------------------------
def test_simulated_engines_declare_what_they_are():
    for eng in (SimEngine(), RealtimeSimEngine()):
        assert dataclasses.replace(eng.info, step_model=None) == EngineInfo(
            "sim", "simulated", max_model_len=None, needs_plan_text=True, supports_prefix_cache=True,
            kv_block_tokens=16)
        m = eng.info.step_model  # their step time is their own model: the scheduler's estimate starts exact
        assert (m.decode_s, m.batch_slowdown, m.prefill_s_per_token) == (
            eng.cfg.decode_s, eng.cfg.batch_slowdown, eng.cfg.prefill_s_per_token)
    assert not make_engine({"backend": "sim", "prefix_caching": False}).info.supports_prefix_cache
    # paced: the wall clock sees every step time_scale times longer
    m = RealtimeSimEngine(time_scale=2.0).info.step_model
    assert m.decode_s == pytest.approx(2 * SimEngine().cfg.decode_s) and "x2" in m.source
    assert m.prefill_s_per_token == pytest.approx(2 * SimEngine().cfg.prefill_s_per_token)


def test_info_is_frozen_and_a_backend_without_a_log_still_has_one():
    info = SimEngine().info
    assert info.kv_block_tokens == SimEngine().cfg.block_size == 16
    assert SimEngine(SimEngineConfig(block_size=32)).info.kv_block_tokens == 32
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.model = "other"  # type: ignore[misc]
    assert isinstance(SimEngine().submissions, SubmissionLog) and len(SimEngine().submissions) == 0
    assert SimEngine().reset_prefix_cache() is False  # nothing to drop: a no-op, not an AttributeError


# -- the factory -------------------------------------------------------------------------------------
def test_factory_builds_the_planner_engine_of_every_sim_config():
    eng, constrained = planner_engine("engine_sim.yaml")  # a bare name is looked up in config/
    assert type(eng) is RealtimeSimEngine and constrained is False
    cfg = load_engine_config("config/engine_sim.yaml")
    assert eng.time_scale == cfg["time_scale"] and eng.cfg.decode_s == cfg["sim_engine"]["decode_s"]
    # the discrete-event simulator's engine from the same file: not paced, same latency model
    sim = make_engine("engine_sim.yaml")
    assert type(sim) is SimEngine and sim.cfg == eng.cfg
    # a top-level mapping: time_scale and constrained are the factory's, not SimEngineConfig fields
    rt = make_engine({"backend": "sim", "decode_s": 0.01, "time_scale": 0.5, "constrained": False}, realtime=True)
    assert rt.time_scale == 0.5 and rt.cfg.decode_s == 0.01


def test_factory_finds_configs_by_name_or_path_and_says_what_is_missing():
    assert find_engine_config("engine_sim.yaml") == paths.config_dir() / "engine_sim.yaml"
    # relative to the working directory, else to the share folder
    assert find_engine_config("config/engine_sim.yaml").resolve() == paths.config_dir() / "engine_sim.yaml"
    absolute = paths.config_dir() / "engine_vllm_cpu.yaml"
    assert find_engine_config(absolute) == absolute
    with pytest.raises(EngineConfigError, match="not found"):
        make_engine("engine_nothing.yaml")
    with pytest.raises(EngineConfigError, match="backend must be one of"):
        make_engine({"backend": "tensorrt"})
    # constrained decoding: on by default wherever the backend takes a grammar, refused where it does not
    for name, on in (("engine_vllm_cpu.yaml", True), ("engine_vllm_gpu.yaml", True), ("engine_remote.yaml", True),
                     ("engine_pool_remote.yaml", True), ("engine_transformers_cpu.yaml", False),
                     ("engine_sim.yaml", False)):
        assert constrained_decoding(load_engine_config(name)) is on, name
    assert constrained_decoding({"backend": "vllm"}) is True  # no key: auto
    with pytest.raises(EngineConfigError, match="constrained: true, but backend transformers takes no grammar"):
        constrained_decoding({"backend": "transformers", "constrained": True})
    with pytest.raises(EngineConfigError, match="constrained must be auto, true or false"):
        constrained_decoding({"backend": "vllm", "constrained": "yes"})


def test_a_malformed_engine_config_names_the_file_line_and_column(tmp_path):
    bad = tmp_path / "engine_bad.yaml"
    bad.write_text("backend: remote\nurl: http://h:1: x\n")
    with pytest.raises(EngineConfigError, match=rf"{bad}: not valid YAML at line 2, column 16: mapping values "
                                                rf"are not allowed here \(the line reads 'url: http://h:1: x'\)"):
        make_engine(bad)
    fitted = tmp_path / "fitted.yaml"
    fitted.write_text("decode_s: [0.02\n")
    with pytest.raises(EngineConfigError, match=rf"step_model: {fitted}: not valid YAML at line 2, column 1"):
        load_step_model({"_path": str(tmp_path / "e.yaml"), "step_model": "fitted.yaml"})


def test_remote_config_errors_name_the_key_before_any_connection():
    """A misspelt or out-of-range setting of the remote backend is refused by name; nothing is contacted
    (the url points nowhere)."""
    base = {"backend": "remote", "url": "http://127.0.0.1:9", "model": "m"}
    with pytest.raises(EngineConfigError, match=r"url and model required"):
        make_engine({"backend": "remote"})
    with pytest.raises(EngineConfigError, match=r"unknown key\(s\) \['read_timeout'\]"):
        make_engine({**base, "read_timeout": 5})
    for key, bad in (("read_timeout_s", 0), ("first_token_timeout_s", -1.0), ("max_batch", "8"),
                     ("connect_timeout_s", True), ("token_timeout_s", 0.0), ("token_timeout_s", "30")):
        with pytest.raises(EngineConfigError, match=f"{key} must be a number > 0, got {bad!r}"):
            make_engine({**base, key: bad})
    assert load_engine_config("engine_remote.yaml")["backend"] == "remote"  # the shipped file's keys are known
    assert set(load_engine_config("engine_remote.yaml")) <= factory.REMOTE_KEYS


def test_step_model_of_a_real_engine_config_is_read_whole_or_refused_by_name(tmp_path):
    """The shipped CPU config seeds the estimate from the fitted file; every field is required, nothing
    else is accepted, and the error names the field (read before any model would load)."""
    m = load_step_model(load_engine_config("engine_vllm_cpu.yaml"))
    fitted = yaml.safe_load((paths.config_dir() / "sim_engine_fitted_cpu.yaml").read_text())["sim_engine"]
    assert (m.decode_s, m.batch_slowdown, m.prefill_s_per_token) == (
        fitted["decode_s"], fitted["batch_slowdown"], fitted["prefill_s_per_token"])
    assert m.source == "fitted: sim_engine_fitted_cpu.yaml"
    assert load_step_model({"backend": "vllm"}) is None
    inline = {"decode_s": 0.03, "batch_slowdown": 0.1, "prefill_s_per_token": 0.001}
    assert load_step_model({"step_model": inline}).decode_s == 0.03
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump({"sim_engine": {**inline, "block_size": 32}}))
    local = {"_path": str(tmp_path / "engine.yaml"), "step_model": "fit.yaml"}  # beside the engine config
    assert load_step_model(local).prefill_s_per_token == 0.001
    for spec, msg in (({**inline, "decode": 1}, r"unknown key\(s\) \['decode'\]"),
                      ({"decode_s": 0.03, "batch_slowdown": 0.1}, r"\['prefill_s_per_token'\] missing"),
                      ({**inline, "decode_s": "fast"}, r"\['decode_s'\] must be numbers"),
                      ({**inline, "prefill_s_per_token": -1.0}, r"prefill_s_per_token=-1.0"),
                      ({**inline, "decode_s": 0}, r"decode_s=0"),
                      ("no_such_fit.yaml", r"file no_such_fit.yaml not found"),
                      (3, r"a file name or a mapping")):
        with pytest.raises(EngineConfigError, match=msg):
            load_step_model({"step_model": spec})
        with pytest.raises(EngineConfigError, match=msg):  # the factory refuses it before contacting anything
            make_engine({"backend": "remote", "url": "http://127.0.0.1:9", "model": "m", "step_model": spec})
    with pytest.raises(EngineConfigError, match="step_model is for real backends"):
        make_engine({"backend": "sim", "step_model": inline})


# -- prompt rendering --------------------------------------------------------------------------------
def test_renderer_for_the_simulated_engine_attaches_the_plan_and_has_no_prompt():
    eng = RealtimeSimEngine()
    r = PromptRenderer(eng, constrained=True)  # constrained means nothing to a simulated engine
    ids, extra = r.render("drone", CAT)
    assert ids == eng.tokenize(CAT) and r.count_tokens(CAT) == len(ids)
    assert extra == {"plan_text": sim_plan_for("drone", CAT)}
    assert r.warm_up_prompts(["drone", "arm"]) == ([], [])
    with pytest.raises(TaskPromptError, match="robot_type"):
        r.render("submarine", CAT)


def test_renderer_for_a_real_engine_renders_the_chat_prompt_and_checks_the_context():
    eng = _ScriptedEngine()
    r = PromptRenderer(eng, constrained=True)
    ids, extra = r.render("drone", CAT)
    assert ids == r.builder("drone").token_ids(CAT) and "".join(map(chr, ids)).endswith("<assistant>")
    assert callable(extra["regex"]) and set(extra) == {"regex"}  # re-evaluated at every resume
    assert PromptRenderer(eng).render("drone", CAT)[1] == {}
    eng.info = dataclasses.replace(eng.info, max_model_len=len(ids) + 15)  # no room for a first segment
    with pytest.raises(TaskPromptError, match=f"the prompt is {len(ids)} tokens, too long"):
        r.render("drone", CAT)
    # a replaced engine (after a restart) gets builders of its own
    r.engine = _ScriptedEngine()
    assert r.builder("drone").tokenizer is r.engine.tokenizer


def test_warm_up_prompts_cover_every_example_set_a_task_can_draw_and_a_burst_no_larger_than_the_batch():
    r = PromptRenderer(_ScriptedEngine(max_batch=3))
    singles, burst = r.warm_up_prompts(["drone", "arm"])
    # per robot type, one prompt per set of example families a task can draw: then every task's prompt but
    # its own turn is in the prefix cache
    for rt in ("drone", "arm"):
        b = r.builder(rt)
        lib = b.library
        assert lib.shots is not None and lib.shots < len(lib.families)
        assert len(lib.combinations()) == math.comb(len(lib.families), lib.shots)
        warmed = [ids for t, ids in singles if t == rt]
        assert len(warmed) == len(lib.combinations())
        sets = [b.messages("x", examples=c)[:-1] for c in lib.combinations()]  # all turns but the task's
        for ex in lib.examples:  # a task like any example draws a warmed set
            assert b.messages(ex["input"])[:-1] in sets, ex["input"]
    assert [rt for rt, _ in singles] == sorted((rt for rt, _ in singles), key=["drone", "arm"].index)
    assert [rt for rt, _ in burst] == ["drone"] * 3
    assert len({tuple(ids) for _, ids in burst}) == 3  # different lengths
    assert len(PromptRenderer(_ScriptedEngine(max_batch=64)).warm_up_prompts(["arm"])[1]) == 8


def test_warm_up_requests_carry_the_grammar_when_decoding_is_constrained():
    assert PromptRenderer(_ScriptedEngine()).warm_up_extra("drone") == {}
    extra = PromptRenderer(_ScriptedEngine(), constrained=True).warm_up_extra("arm")
    assert callable(extra["regex"]) and extra["regex"]("")


# -- the core's warm-up -------------------------------------------------------------------------------
def test_core_warm_up_runs_throw_away_generations_and_leaves_the_core_untouched():
    eng = _ScriptedEngine()
    core = PlannerCore(eng, make_policy("pud"), SimClock())
    singles, burst = PromptRenderer(eng).warm_up_prompts(["drone", "arm"])
    steps = warm_up(core, singles, burst)
    assert steps == eng.steps and not eng.has_work()
    assert [(r.max_new_tokens, r.suspend_at_boundary) for r in eng.requests] == (
        [(1, True)] * len(singles) + [(4, False)] * len(burst))
    assert [r.prompt_token_ids for r in eng.requests] == [ids for _, ids in singles + burst]
    assert all(len(r.output_token_ids) == r.max_new_tokens for r in eng.requests)
    assert core.step_count == 0 and core.snapshot()["tasks"] == 0 and core.pending() == 0
    assert warm_up(core, []) == 0


def test_core_warm_up_refuses_a_busy_engine():
    eng = _ScriptedEngine()
    core = PlannerCore(eng, make_policy("pud"), SimClock())
    from timelyllm_ros.skills.segmenter import make_stop_checker

    eng.add(EngineRequest("busy", [1, 2], make_stop_checker("drone"), max_new_tokens=3))
    with pytest.raises(RuntimeError, match="already serving"):
        warm_up(core, [("drone", [1, 2, 3])])
    assert [r.gen_id for r in eng.requests] == ["busy"]


def test_no_engine_attribute_is_probed_outside_the_engines():
    """Callers read Engine.info; getattr/hasattr on an engine is how a capability goes undeclared."""
    root = Path(__file__).resolve().parent.parent
    offenders = []
    for py in [*root.joinpath("timelyllm_ros").rglob("*.py"), *root.joinpath("bench").glob("*.py")]:
        if "engines" in py.parts:
            continue
        for i, line in enumerate(py.read_text().splitlines(), 1):
            if any(f"{fn}({obj}" in line for fn in ("getattr", "hasattr")
                   for obj in ("engine", "eng,", "self.engine", "self._engine")):
                offenders.append(f"{py.relative_to(root)}:{i}: {line.strip()}")
    assert not offenders, offenders


class _ExplodingChecker(StopChecker):
    """A stop checker with a bug: it raises on the text ``)``."""

    def __init__(self) -> None:
        self.inner = make_stop_checker("drone")

    def feed(self, piece: str) -> bool:
        if piece == ")":
            raise RuntimeError("checker bug")
        return self.inner.feed(piece)

    def cut(self) -> str:
        return self.inner.cut()

    @property
    def pending_text(self) -> str:
        raise RuntimeError("checker bug")


def test_a_stop_checker_that_raises_ends_its_generation_alone():
    """One generation's checker failing is that generation's ERROR, not a step that raises (which would fail
    every generation of the engine: the planner rebuilds it, a pool takes the member down)."""
    eng = _ScriptedEngine()
    eng.add(EngineRequest("bad", [1], _ExplodingChecker(), suspend_at_boundary=False))
    eng.add(EngineRequest("good", [1], make_stop_checker("drone"), suspend_at_boundary=False))
    events = [ev for _ in range(5) for ev in eng.step().events]
    (bad,) = [e for e in events if e.gen_id == "bad"]
    assert bad.reason is FinishReason.ERROR and not bad.engine_failed
    assert bad.error == ("the stop checker (_ExplodingChecker) failed on segment text 'mf(50)': "
                         "RuntimeError: checker bug"), bad.error
    assert [(e.text, e.reason) for e in events if e.gen_id == "good"] == [("mf(50)", FinishReason.SEGMENT)]
    assert eng.running_ids() == {"good"}
