"""The engine pool (issue 13 items 2 and 3): placement, failover, rejoin, start-up checks and the factory.

Members are simulated engines (deterministic, no weights, modelled time); a member that fails is a SimEngine
whose step raises (an in-process engine that crashed) or ends its generations with an error finish (what a
remote engine reports when its server dies or stops answering). The real-server test is in
test_engine_remote.py's style at the end (two vLLM servers, one killed mid-generation).
"""

from __future__ import annotations

import pytest
from test_scheduler import drain, spec

from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.domain.types import TaskStatus
from timelyllm_ros.engines import driver
from timelyllm_ros.engines.base import EngineRequest, FinishReason, RawTokens, concat_segments
from timelyllm_ros.engines.factory import EngineConfigError, load_engine_config, make_engine, pool_member_configs
from timelyllm_ros.engines.pool import EnginePool, NoMemberUp, PoolMismatchError, PoolStats
from timelyllm_ros.engines.sim_engine import SimEngine, SimEngineConfig
from timelyllm_ros.engines.sim_realtime import sim_plan_for
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.policies import make_policy
from timelyllm_ros.planner.warmup import warm_up
from timelyllm_ros.skills.segmenter import make_stop_checker

TASKS = ["Could you find the cat? If so, go to it.", "Take a picture of the kitchen.", "Go to the apple.",
         "Is there a person? If so, turn around.", "Find a bottle and go to it.", "Look for the dog."]


class _Flaky(SimEngine):
    """A simulated member that can fail: ``crash`` makes its step raise (an in-process engine that died),
    ``cut`` makes it end every running generation with an error finish, as a remote engine does when its
    server dies or stops answering (the tokens of the step are still handed over first)."""

    def __init__(self, config: SimEngineConfig | None = None) -> None:
        super().__init__(config)
        self.crash = self.cut = self.refuse = False

    def _backend_step(self):
        if self.crash:
            raise ConnectionError("engine core died")
        outs, dur, prefill = super()._backend_step()
        if self.cut:
            outs = [RawTokens(o.gen_id, o.token_ids, o.pieces, FinishReason.ERROR, error="the connection to the "
                              "server broke: the server died", engine_failed=True) for o in outs]
        elif self.refuse:  # the request's own error (a remote server's HTTP 400): the engine is fine
            outs = [RawTokens(o.gen_id, [], [], FinishReason.ERROR, error="HTTP 400: bad regex") for o in outs]
        return outs, dur, prefill


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# A system prompt per robot type that every prompt of that type starts with (as the planner's do): what a
# member's prefix cache shares between requests, 400 tokens as in the simulator's make-up (ids out of the
# simulated tokenizer's range, so no task shares them)
_SYSTEM = {rt: list(range(300000 + 1000 * k, 300400 + 1000 * k)) for k, rt in enumerate(["drone", "arm"])}


def _req(i: int, robot_type: str = "drone", **kw) -> EngineRequest:
    task = TASKS[i % len(TASKS)]
    eng = SimEngine()
    return EngineRequest(f"g{i}", _SYSTEM[robot_type] + eng.tokenize(task), make_stop_checker(robot_type),
                         extra={"plan_text": sim_plan_for(robot_type, task), "robot_type": robot_type}, **kw)


def _pool(n: int = 2, *, max_batch: int = 4, decode=None, rebuild=None, **kw) -> tuple[EnginePool, list[_Flaky]]:
    members = [_Flaky(SimEngineConfig(max_batch=max_batch, decode_s=(decode or [0.022] * n)[i])) for i in range(n)]
    return EnginePool(members, rebuild=rebuild, background_probes=False, **kw), members


def _reference(reqs: list[EngineRequest]) -> dict[str, list[int]]:
    """What one engine writes for these requests, run alone."""
    fresh = [_req(int(r.gen_id[1:]), r.extra["robot_type"], suspend_at_boundary=r.suspend_at_boundary)
             for r in reqs]
    driver.run(SimEngine(), fresh)
    return {r.gen_id: r.output_token_ids for r in fresh}


def _owner(pool: EnginePool, gen_id: str) -> int | None:
    return next((s.index for s in pool.members() if s.up and gen_id in pool.member_engine(s.index).running_ids()),
                None)


# -- placement -------------------------------------------------------------------------------------------------
def test_placement_fills_the_affine_member_then_spills_over_by_capacity():
    pool, members = _pool(max_batch=2)
    for i in range(3):
        pool.add(_req(i))
    assert [_owner(pool, f"g{i}") for i in range(3)] == [0, 0, 1]  # g2: member 0 has no free slot
    pool.add(_req(3, "arm"))  # no member served arms yet: the less loaded free one
    assert _owner(pool, "g3") == 1
    assert [s.owned for s in pool.members()] == [2, 2]
    pool.add(_req(4))  # every member full: still placed (the server queues it), never refused
    assert _owner(pool, "g4") in (0, 1) and pool.stats().max_batch == 4


def test_placement_prefers_the_robot_types_member_and_a_resumed_generation_goes_home():
    pool, _ = _pool(max_batch=8)
    reqs = [_req(0, "drone"), _req(1, "arm"), _req(2, "drone"), _req(3, "arm")]
    for r in reqs:
        pool.add(r)
    assert [_owner(pool, f"g{i}") for i in range(4)] == [0, 1, 0, 1]
    # g1 (arm, member 1) is suspended at its first boundary, then resumed: back to member 1, whose prefix
    # cache holds its prompt and plan so far, though member 0 now has fewer generations
    for g in ("g0", "g2", "g3"):
        pool.abort(g)
    r1 = reqs[1]
    while not any(e.suspended for e in pool.step().events):
        pass
    assert "g1" not in pool.running_ids()
    pool.add(r1)
    assert _owner(pool, "g1") == 1
    assert pool.member_engine(1).submissions is not None


class _Keeping(_Flaky):
    """A member that keeps what a suspended generation held (as vLLM's parked request or the transformers
    engine's cache do) until it is resumed there or aborted."""

    def __init__(self, config: SimEngineConfig | None = None) -> None:
        super().__init__(config)
        self.kept: set[str] = set()

    def _backend_suspend(self, gen_id: str) -> None:
        super()._backend_suspend(gen_id)
        self.kept.add(gen_id)

    def _backend_add(self, req: EngineRequest) -> None:
        self.kept.discard(req.gen_id)
        super()._backend_add(req)

    def suspended_ids(self) -> set[str]:
        return set(self.kept)

    def abort(self, gen_id: str) -> None:
        self.kept.discard(gen_id)
        super().abort(gen_id)


def test_what_a_member_keeps_of_a_suspended_generation_is_released_on_abort_and_when_it_resumes_elsewhere():
    members = [_Keeping(SimEngineConfig(max_batch=4)) for _ in range(2)]
    pool = EnginePool(members, background_probes=False)
    reqs = [_req(0), _req(1)]
    for r in reqs:
        pool.add(r)
    assert [_owner(pool, r.gen_id) for r in reqs] == [0, 0]
    while pool.has_work():
        pool.step()  # both to their first boundary: suspended, kept by member 0
    assert pool.suspended_ids() == {"g0", "g1"} == members[0].kept
    pool.abort("g0")  # e.g. its task was cancelled while its robot moved
    assert members[0].kept == {"g1"}
    for i in range(2, 6):  # member 0 full: g1 resumes on member 1, and member 0 lets go of it
        pool.add(_req(i))
    pool.add(reqs[1])
    assert _owner(pool, "g1") == 1 and members[0].kept == set()


def test_placement_prefers_the_member_with_the_lower_measured_step_time():
    pool, _ = _pool(decode=[0.05, 0.01], max_batch=8)
    pool.add(_req(0, "drone"))
    assert _owner(pool, "g0") == 1  # seeded from the members' step models: member 1 is 5x faster
    for _ in range(10):  # the first step's prefill (the 400-token system prompt) decays out of the EWMA
        pool.step()
    st = {s.index: s.step_time_s for s in pool.members()}
    assert st[1] == pytest.approx(0.01, rel=0.5) and st[0] == pytest.approx(0.05)  # measured / declared
    pool.add(_req(1, "arm"))
    assert _owner(pool, "g1") == 1


def test_a_busy_pool_spreads_by_load_against_the_prefill_a_warm_member_saves():
    """Affinity alone put every drone generation on member 0 of a pool with 256 slots each while the others
    idled (bench/results/pool). A warm member keeps new generations while the time one more adds there (its
    decode steps longer for all) is below a cold member's prefill of the system prompt; once the others hold
    that prompt too, load alone decides."""
    pool, _ = _pool(4, max_batch=256)
    first = []
    for i in range(40):
        pool.add(_req(i, "drone"))
        first.append(_owner(pool, f"g{i}"))
    assert first[:2] == [0, 0]  # light: the second one shares member 0's cached system prompt
    owned = [s.owned for s in pool.members()]
    assert sum(owned) == 40 and all(o > 0 for o in owned) and max(owned) - min(owned) <= 2, owned
    # a light pool stays warm: after everything is aborted, a new drone generation goes to a member that
    # served drones (each has by now), the least loaded of them
    n = 40
    for i in range(n):
        pool.abort(f"g{i}")
    pool.add(_req(n, "drone"))
    assert _owner(pool, f"g{n}") == 0
    pool.add(_req(n + 1, "arm"))  # no member served arms: the least loaded, the lowest index on ties
    assert _owner(pool, f"g{n + 1}") == 1


def test_a_pool_runs_generations_like_one_engine_and_reports_each_member():
    reqs = [_req(i, rt) for i, rt in enumerate(["drone", "arm", "drone", "arm", "drone"])]
    ref = _reference(reqs)
    pool, members = _pool(max_batch=2)
    events = driver.run(pool, reqs)
    for r in reqs:
        assert events[r.gen_id][-1].reason is FinishReason.STOP
        assert r.output_token_ids == ref[r.gen_id]
    assert all(m.total_decode_tokens > 0 for m in members)  # both served
    st = pool.stats()
    assert isinstance(st, PoolStats) and st.members_up == 2 and st.failovers == 0 and st.max_batch == 4
    assert [(s.index, s.backend, s.up, s.owned) for s in st.members] == [(0, "sim", True, 0), (1, "sim", True, 0)]
    assert pool.info.name == "pool" and pool.info.model == "simulated" and pool.info.needs_plan_text
    assert pool.info.kv_block_tokens == members[0].info.kv_block_tokens == 16


# -- failover ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["crash", "cut"])
@pytest.mark.parametrize("segmented", [True, False])
def test_a_member_that_fails_mid_generation_loses_no_generation_and_no_token(how, segmented):
    reqs = [_req(i, rt, suspend_at_boundary=segmented)
            for i, rt in enumerate(["drone", "arm", "drone", "arm", "drone", "arm"])]
    ref = _reference(reqs)
    pool, members = _pool(max_batch=8)

    def hit(step: int) -> None:
        if step == 7:
            setattr(members[0], how, True)

    events = driver.run(pool, reqs, on_step=hit)
    moved = pool.stats().failovers
    assert moved >= 1 and not pool.members()[0].up and "member 0" in pool.why_down()
    for r in reqs:
        evs = events[r.gen_id]
        assert evs[-1].reason is FinishReason.STOP, evs[-1]
        assert r.output_token_ids == ref[r.gen_id]  # the token ids carried over: the same plan
        assert [t for e in evs for t in e.token_ids] == r.output_token_ids  # each segment whole, across the move
        assert concat_segments(evs) == r.extra["plan_text"]
    assert pool.members()[0].failovers == moved


def test_an_error_of_the_request_itself_ends_that_generation_and_leaves_the_member_up():
    pool, members = _pool()
    pool.add(_req(0))
    pool.step()
    members[0].refuse = True
    (ev,) = pool.step().events
    assert (ev.gen_id, ev.reason, ev.error) == ("g0", FinishReason.ERROR, "HTTP 400: bad regex")
    assert not ev.engine_failed
    assert pool.members()[0].up and pool.stats().failovers == 0 and not pool.has_work()


def test_with_no_member_up_the_generations_end_with_an_error_that_names_the_cause():
    pool, members = _pool()
    reqs = [_req(i, rt) for i, rt in enumerate(["drone", "arm", "drone"])]
    for r in reqs:
        pool.add(r)
    pool.step()
    members[0].crash = members[1].cut = True
    finals = {}
    for _ in range(10):
        for e in pool.step().events:
            if e.final:
                finals[e.gen_id] = e
        if not pool.has_work():
            break
    assert set(finals) == {"g0", "g1", "g2"} and not pool.has_work()
    for e in finals.values():
        assert e.reason is FinishReason.ERROR and not e.suspended
        assert "no other member of the engine pool is up" in e.error or "moved" in e.error, e.error
        assert "engine core died" in e.error or "server died" in e.error
    assert pool.stats().failed_unplaced == 3 and pool.stats().members_up == 0
    with pytest.raises(NoMemberUp, match=r"g9: no member of the engine pool is up to take it \(member 0: .*engine "
                                         r"core died"):
        pool.add(_req(9))


def test_a_planner_core_on_a_pool_finishes_every_task_across_a_failover():
    """Nothing in the scheduler knows of the pool: the core drives it as one engine."""
    clock = SimClock()
    members = [_Flaky(), _Flaky()]
    pool = EnginePool(members, background_probes=False)
    results = []
    core = PlannerCore(pool, make_policy("pud"), clock, on_result=results.append)
    for i in range(6):
        core.submit(spec(i, plan="tc(30);mf(50);tc(10);mf(20);"))
    while core.step_count < 8 or not pool.members()[0].owned:  # past a first segment, member 0 busy
        rep = core.start_step()
        if rep is None:
            clock.set(max(core.next_wakeup(), clock.now()))
            continue
        clock.advance(rep.duration_s)
        core.complete_step(rep)
    assert not results
    members[0].crash = True
    drain(core, clock)
    assert sorted(r.task_id for r in results) == [f"t{i}" for i in range(6)]
    assert all(r.status is TaskStatus.DONE and r.plan == "tc(30);mf(50);tc(10);mf(20);" for r in results), results
    assert pool.stats().failovers >= 1
    # and with every member down a new task fails at once, explicitly
    members[1].crash = True
    pool.mark_down(1, "test: member 1 crashed")
    core.submit(spec(7))
    drain(core, clock)
    assert results[-1].task_id == "t7" and results[-1].status is TaskStatus.FAILED
    assert "no member of the engine pool is up" in results[-1].reason


def test_warm_up_reaches_every_member_that_is_up():
    """Each member has its own prefix cache: the planner's warm-up prefills the shared prompts on each one."""

    class _Prompted(SimEngine):  # takes a prompt without a recorded plan, as a real engine does
        def __init__(self) -> None:
            super().__init__()
            self.added: list[str] = []

        def _backend_add(self, req):
            self.added.append(req.gen_id)
            req.extra.setdefault("plan_text", "tc(30);")
            super()._backend_add(req)

    members = [_Prompted(), _Prompted(), _Prompted()]
    pool = EnginePool(members, background_probes=False)
    pool.mark_down(2, "test: down before start")
    core = PlannerCore(pool, make_policy("pud"), SimClock())
    assert warm_up(core, [("drone", list(range(40))), ("arm", list(range(50, 90)))]) > 0
    assert [m.added for m in members] == [["warmup-drone-0", "warmup-arm-1"]] * 2 + [[]]
    assert not pool.has_work() and all(not m.owned for m in pool.members())


# -- rejoin -----------------------------------------------------------------------------------------------------
def test_a_down_member_is_rebuilt_after_a_growing_backoff_and_rejoins():
    clock = _Clock()
    healthy = {"ok": False}
    built = []

    def rebuild():
        if not healthy["ok"]:
            raise ConnectionError("connection refused")
        built.append(_Flaky())
        return built[-1]

    pool, members = _pool(rebuild=[rebuild, None], clock=clock, probe_backoff_s=1.0, probe_max_backoff_s=3.0)
    pool.add(_req(0))
    members[0].crash = True
    pool.step()
    assert not pool.members()[0].up and _owner(pool, "g0") == 1
    pool.step()  # before the backoff: no probe
    clock.t = 1.0
    pool.step()  # probe 1 fails: next in 2 s
    assert "rejoin failed: ConnectionError: connection refused" in pool.members()[0].down_reason
    clock.t = 2.5
    pool.step()
    assert not built and not pool.members()[0].up
    healthy["ok"] = True
    clock.t = 3.0
    pool.step()
    st = pool.members()[0]
    assert st.up and st.rejoins == 1 and st.down_reason == "" and pool.member_engine(0) is built[0]
    pool.add(_req(1, "arm"))
    assert _owner(pool, "g1") == 0  # serving again
    assert pool.stats().members_up == 2


def test_a_rebuild_runs_in_the_background_and_the_member_rejoins_when_it_is_done():
    """The default: a probe of a hung server must not stall the planner loop (joined here, no timing)."""
    clock = _Clock()
    built = []
    members = [_Flaky(), _Flaky()]
    pool = EnginePool(members, rebuild=[lambda: built.append(_Flaky()) or built[-1], None], clock=clock)
    try:
        pool.add(_req(0))
        members[0].crash = True
        pool.step()
        clock.t = 5.0
        pool.step()  # the probe starts in the background
        probe = pool.rejoin_probe(0)
        assert probe is not None and not pool.members()[0].up
        probe.result(timeout=60)
        pool.step()  # and its engine joins at the next step
        assert pool.members()[0].up and pool.member_engine(0) is built[0]
    finally:
        pool.close()


def test_a_member_that_comes_back_serving_another_model_stays_down():
    clock = _Clock()
    pool, members = _pool(rebuild=[lambda: SimEngine(SimEngineConfig(prefix_caching=False)), None], clock=clock)
    members[0].crash = True
    pool.add(_req(0))
    pool.step()
    pool.step()
    clock.t = 10.0
    pool.step()
    st = pool.members()[0]
    assert not st.up and "came back serving something else: supports_prefix_cache=False" in st.down_reason


# -- start-up checks and the factory ------------------------------------------------------------------------------
def test_members_that_serve_different_models_are_refused_naming_them():
    with pytest.raises(PoolMismatchError, match=r"b \(supports_prefix_cache=False, a has True\)"):
        EnginePool([SimEngine(), SimEngine(SimEngineConfig(prefix_caching=False))], names=["a", "b"])
    with pytest.raises(ValueError, match="at least one member"):
        EnginePool([])
    with pytest.raises(ValueError, match="a pool cannot be a member"):
        EnginePool([EnginePool([SimEngine()])])


def test_factory_builds_a_pool_and_names_the_member_of_a_bad_config(tmp_path):
    pool = make_engine({"backend": "pool", "members": ["engine_sim.yaml", {"backend": "sim"}], "step_wait_s": 0.01})
    assert isinstance(pool, EnginePool) and [s.name for s in pool.members()] == [
        f"member 0 (sim: {load_engine_config('engine_sim.yaml')['_path']})", "member 1 (sim: sim)"]
    assert pool.step_wait_s == 0.01 and pool.stats().members_up == 2
    (tmp_path / "m.yaml").write_text("backend: sim\n")  # a file beside the pool's config
    (tmp_path / "pool.yaml").write_text("backend: pool\nmembers: [m.yaml, m.yaml]\n")
    assert make_engine(tmp_path / "pool.yaml").stats().members_up == 2
    for cfg, msg in (({"members": []}, "must be a non-empty list"),
                     ({"members": [{"backend": "pool", "members": [{"backend": "sim"}]}]},
                      "pool member 0: a pool cannot be a member of a pool"),
                     ({"members": [{"backend": "sim"}, "no_such.yaml"]}, "pool member 1: engine config no_such"),
                     ({"members": [{"backend": "sim"}, 3]}, "pool member 1: a file name or a mapping"),
                     ({"members": [{"backend": "sim"}], "step_wait": 1}, r"unknown key\(s\) \['step_wait'\]"),
                     ({"members": [{"backend": "sim"}], "step_wait_s": 0}, "step_wait_s must be a number > 0"),
                     ({"members": [{"backend": "sim"}, {"backend": "sim", "prefix_caching": False}]},
                      r"member 1 \(sim: sim\) \(supports_prefix_cache=False"),
                     ({"members": [{"backend": "sim"}, {"backend": "sim", "decode_ms": 1}]},
                      r"pool member 1 \(sim: sim\): TypeError")):
        with pytest.raises(EngineConfigError, match=msg):
            make_engine({"backend": "pool", **cfg})


def test_the_shipped_remote_pool_config_is_valid_without_contacting_a_server():
    cfg = load_engine_config("engine_pool_remote.yaml")
    members = pool_member_configs(cfg)
    assert [m["backend"] for m in members] == ["remote", "remote"]
    assert len({m["url"] for m in members}) == 2 and len({m["model"] for m in members}) == 1


def test_an_unreachable_member_is_named_at_start_up():
    cfg = {"backend": "pool", "members": [{"backend": "sim"}, {"backend": "remote", "url": "http://127.0.0.1:9",
                                                             "model": "m", "connect_timeout_s": 1}]}
    pytest.importorskip("httpx")
    with pytest.raises(EngineConfigError, match=r"pool member 1 \(remote: http://127\.0\.0\.1:9\): "
                                                r"RemoteServerError: vLLM server at .* is unreachable"):
        make_engine(cfg)


# -- two real vLLM servers, one killed mid-generation (CPU, bundled model; slow: -m "not engine") ---------------
@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    from test_engine_remote import SERVED, START_TIMEOUT_S, _model_dir

    from devtools.vllm_server import VllmServer

    model = _model_dir()
    started = []
    try:  # both start at once (a cold start is minutes on two cores), then both must be ready
        for name in ("vllm-pool-a", "vllm-pool-b"):
            started.append(VllmServer(model, SERVED, log_path=tmp_path_factory.mktemp(name) / "serve.log"))
        for srv in started:
            srv.wait_ready(START_TIMEOUT_S)
        yield started
    finally:
        for srv in started:
            srv.stop()


@pytest.mark.engine
def test_a_killed_server_s_generations_resume_on_the_other_with_the_same_greedy_output(two_servers):
    import time

    from test_engine_remote import BOY, CFG, _req

    from timelyllm_ros.engines.prompts import PromptBuilder

    a, b = two_servers
    # the default read timeout (10 s): with 5 s, the reference run below (no failure yet) failed over once under
    # a CPU hog, a member's 1.6k-token prefill answering late; a killed server is seen at once either way
    member = {**load_engine_config(CFG), "connect_timeout_s": 2.0}
    member.pop("_path")
    pool = make_engine({"backend": "pool", "members": [{**member, "url": a.url}, {**member, "url": b.url}],
                        "probe_backoff_s": 600.0, "probe_max_backoff_s": 600.0})
    try:
        assert pool.info.model == "SmolLM2-135M-Instruct" and pool.info.max_model_len == 2048
        pb = PromptBuilder(pool.tokenizer, "drone")

        def reqs(tag):  # one streamed to 120 tokens whatever the model writes, one suspended at every boundary
            return [_req(pb, f"long-{tag}", max_new_tokens=120, suspend_at_boundary=False, max_segment_tokens=1000,
                         extra={"ignore_eos": True}),
                    _req(pb, f"seg-{tag}", task=BOY)]

        ref = reqs("ref")
        ev_ref = driver.run(pool, ref)  # no failure (placement may use either server: it weighs their load)
        assert all(s.owned == 0 for s in pool.members()) and pool.stats().failovers == 0
        assert all(ev_ref[r.gen_id][-1].reason in (FinishReason.STOP, FinishReason.LENGTH) for r in ref)

        run = reqs("run")
        killed = {"at": None, "member": None}
        servers = {0: a, 1: b}
        t0 = time.monotonic()

        def kill_the_long_ones_server(step: int) -> None:
            if killed["at"] is None and len(run[0].output_token_ids) >= 20:
                owner = _owner(pool, "long-run")
                if owner is not None:  # streaming: it is on a member (not between segments)
                    killed["at"], killed["member"] = len(run[0].output_token_ids), owner
                    servers[owner].kill()
            assert time.monotonic() - t0 < 300, "the pool did not finish within 300 s"

        events = driver.run(pool, run, on_step=kill_the_long_ones_server)
        dead, alive = killed["member"], 1 - (killed["member"] or 0)
        assert killed["at"] is not None and not pool.members()[dead].up and pool.members()[alive].up
        assert pool.stats().failovers >= 1 and f"server at {servers[dead].url}" in pool.members()[dead].down_reason
        for r, w in zip(run, ref, strict=True):
            evs = events[r.gen_id]
            assert evs[-1].reason is ev_ref[w.gen_id][-1].reason, evs[-1]
            assert r.output_token_ids == w.output_token_ids  # across the failover: the unsegmented greedy output
            assert [e.text for e in evs] == [e.text for e in ev_ref[w.gen_id]]
        assert len(run[0].output_token_ids) == 120 > killed["at"]  # the long one was moved mid-stream
        assert any(s["gen_id"] == "long-run" for s in pool.member_engine(alive).submissions)  # resumed there
    finally:
        pool.close()
