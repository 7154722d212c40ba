from timelyllm_ros.domain.plans import plan_templates
from timelyllm_ros.engines.base import EngineRequest, FinishReason
from timelyllm_ros.engines.sim_engine import SimEngine, SimEngineConfig, bpe_pieces
from timelyllm_ros.skills.segmenter import make_stop_checker, split_segments
from timelyllm_ros.skills.skill_files import load_skill_set


def run_gen(eng, req):
    """Drive one generation to the end, resuming after every suspension; return events."""
    events = []
    eng.add(req)
    while True:
        rep = eng.step()
        assert rep.duration_s > 0
        for ev in rep.events:
            events.append(ev)
            if ev.final:
                return events
            if ev.suspended:
                eng.add(req)


def test_pieces_roundtrip():
    for tpl in plan_templates().values():
        assert "".join(bpe_pieces(tpl.plan)) == tpl.plan


def test_simulated_segmentation_matches_split_segments():
    for tpl in plan_templates().values():
        ss = load_skill_set(tpl.robot_type)
        eng = SimEngine()
        req = EngineRequest(f"g{tpl.trace_id}", list(range(100)), make_stop_checker(ss),
                            extra={"plan_text": tpl.plan, "robot_type": tpl.robot_type})
        evs = run_gen(eng, req)
        texts = [e.text for e in evs if e.text]
        assert texts == split_segments(ss, bpe_pieces(tpl.plan))
        assert evs[-1].reason is FinishReason.STOP
        assert "".join(texts) == tpl.plan


def test_resume_hits_prefix_cache_and_step_model():
    cfg = SimEngineConfig()
    eng = SimEngine(cfg)
    ss = load_skill_set("drone")
    req = EngineRequest("g", list(range(1000, 1400)), make_stop_checker(ss), extra={"plan_text": "tc(30);mf(50);"})
    evs = run_gen(eng, req)
    assert evs[0].cached_prompt_tokens == 0
    assert evs[1].cached_prompt_tokens >= 400  # resumed: the prompt comes from the prefix cache
    assert eng.total_prefill_tokens < 400 + 32
    assert cfg.step_time(1) == 0.022
    assert cfg.step_time(5, 2884) > cfg.step_time(5)


def test_non_segmented_streams_without_suspending():
    eng = SimEngine()
    req = EngineRequest("g", [1, 2, 3], make_stop_checker(load_skill_set("drone")),
                        extra={"plan_text": "tc(30);mf(50);"}, suspend_at_boundary=False)
    evs = run_gen(eng, req)
    assert [e.suspended for e in evs] == [False, False, False]
    assert [e.text for e in evs] == ["tc(30);", "mf(50);", ""]


def test_a_prefill_step_costs_its_fixed_part_once_and_nothing_without_prefill():
    import pytest

    cfg = SimEngineConfig(decode_s=0.04, batch_slowdown=0.0, prefill_s_per_token=0.001, prefill_step_s=0.015)
    assert cfg.step_time(2) == pytest.approx(0.04)
    assert cfg.step_time(2, 100) == pytest.approx(0.04 + 0.015 + 0.1)
    with pytest.raises(ValueError, match="prefill_step_s >= 0"):
        SimEngineConfig(prefill_step_s=-0.001)


def test_a_warmed_prefix_is_a_cache_hit_and_costs_no_time():
    eng = SimEngine(SimEngineConfig(block_size=4))
    ids = list(range(100, 140))
    assert eng.warm_prefix(ids) == 10
    assert eng.warm_prefix(ids) == 0  # already there
    eng.add(EngineRequest("g", ids + [7, 8], make_stop_checker("drone"), extra={"plan_text": "tc(90);"}))
    rep = eng.step()
    assert rep.prefill_tokens == 2  # only what follows the warmed blocks


def test_at_most_max_batch_requests_run_and_the_rest_wait_their_turn():
    eng = SimEngine(SimEngineConfig(max_batch=2, block_size=4))
    for i, plan in enumerate(["tc(90);", "tc(90);mf(50);mf(50);mf(50);", "tc(90);"]):
        eng.add(EngineRequest(f"g{i}", [10 + i, 20, 30, 40, 50], make_stop_checker("drone"),
                              suspend_at_boundary=False, extra={"plan_text": plan}))
    first = eng.step()
    assert eng.stats().running == 2 and eng.stats().waiting == 1
    assert first.duration_s == SimEngineConfig(max_batch=2, block_size=4).step_time(2, first.prefill_tokens)
    started = set()
    while eng.has_work():
        rep = eng.step()
        started |= {ev.gen_id for ev in rep.events}
        assert eng.stats().running <= 2
    assert "g2" in started  # the third ran once a slot was free


def test_waiting_requests_start_in_order_and_an_aborted_one_gives_its_turn_away():
    eng = SimEngine(SimEngineConfig(max_batch=1, block_size=4))
    for i in range(3):
        eng.add(EngineRequest(f"g{i}", [10 + i, 20, 30, 40, 50], make_stop_checker("drone"),
                              suspend_at_boundary=False, extra={"plan_text": "tc(90);"}))
    assert eng.stats().running == 1 and eng.stats().waiting == 2
    eng.abort("g1")  # waiting, never started
    assert eng.stats().waiting == 1
    order = []
    while eng.has_work():
        for ev in eng.step().events:
            if ev.final:
                order.append(ev.gen_id)
    assert order == ["g0", "g2"]
