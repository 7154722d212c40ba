"""The remote backend against a real vLLM server (CPU, bundled SmolLM2-135M), issue 13 part 1.

One server for the module (started once, killed with its process group at teardown); the tests that
hang or kill a server use a second, short-lived one, last in the module. Slow: deselect locally with
``-m "not engine"``.
"""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

from devtools.vllm_server import VllmServer, free_port
from timelyllm_ros.engines import driver
from timelyllm_ros.engines.base import EngineRequest, FinishReason, concat_segments
from timelyllm_ros.engines.factory import EngineConfigError, make_engine, resolve_model_path
from timelyllm_ros.engines.prompts import PromptBuilder
from timelyllm_ros.engines.remote_engine import RemoteServerError, prefix_caching_problem
from timelyllm_ros.skills.segmenter import make_stop_checker

pytestmark = pytest.mark.engine

SERVED = "SmolLM2-135M-Instruct"
CFG = "config/engine_remote.yaml"
CAT = "Scene: [] Task: [A] Could you find the cat? If so, go to it."
BOY = ("Scene: [boy x:0.48 y:0.51 width:0.2 height:0.4] Task: [E] You provided me with plan mf,100, but I "
       "encountered a failure because a boy is passing by. Execution history: mf(50)")
START_TIMEOUT_S = 420.0  # a cold start on 2 shared cores; the failure shows the server's log


def _model_dir() -> str:
    pytest.importorskip("vllm")
    pytest.importorskip("httpx")
    try:
        return resolve_model_path("models/SmolLM2-135M-Instruct")
    except EngineConfigError as e:
        pytest.skip(str(e))


def _start(tmp_path_factory, name: str) -> VllmServer:
    srv = VllmServer(_model_dir(), SERVED, log_path=tmp_path_factory.mktemp(name) / "serve.log")
    try:
        srv.wait_ready(START_TIMEOUT_S)
    except BaseException:
        srv.stop()
        raise
    return srv


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = _start(tmp_path_factory, "vllm-serve")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def eng(server):
    e = make_engine(CFG, url=server.url)
    yield e
    e.close()


@pytest.fixture(scope="module")
def pb(eng):
    return PromptBuilder(eng.tokenizer, "drone")


def _req(pb, gid, task=CAT, max_new_tokens=48, **kw):
    return EngineRequest(gid, pb.token_ids(task), make_stop_checker(pb.skillset), max_new_tokens=max_new_tokens,
                         **kw)


def _metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}}\s+(\S+)", text, re.MULTILINE))


def test_start_up_reads_the_server(eng, server):
    info = eng.info
    assert (info.name, info.model, info.max_model_len) == ("remote", SERVED, 2048)
    assert info.supports_prefix_cache and not info.needs_plan_text
    assert eng.block_size == info.kv_block_tokens == 32 and eng.reports_cached_tokens
    assert eng.url == server.url


@pytest.mark.parametrize("task", [CAT, BOY])
def test_segmented_generation_concatenates_to_the_unsegmented_output(eng, pb, task):
    """(a) Suspended at every skill boundary, each resume a new request from prompt + generated ids."""
    seg = _req(pb, f"s-{task[:12]}", task=task)
    whole = _req(pb, f"w-{task[:12]}", task=task, suspend_at_boundary=False)
    ev_w = driver.run(eng, [whole])[whole.gen_id]
    ev_s = driver.run(eng, [seg])[seg.gen_id]
    assert ev_s[-1].reason is FinishReason.STOP and ev_w[-1].reason is FinishReason.STOP, (ev_s[-1], ev_w[-1])
    assert seg.output_token_ids == whole.output_token_ids
    assert [e.text for e in ev_s] == [e.text for e in ev_w]
    assert concat_segments(ev_s) == eng.decode(seg.output_token_ids)
    assert sum(e.suspended for e in ev_s) >= 1 and not any(e.suspended for e in ev_w)
    assert pb.skillset.validate(concat_segments(ev_s), complete=True) is None


def test_resumed_requests_report_cached_prompt_tokens(eng, pb):
    """(b) From the server's usage (prompt_tokens_details.cached_tokens). vLLM sends it in a stream's last
    chunk, so a submission cut at a boundary has none (None) as a rule; the one that ends the plan has."""
    r = _req(pb, "resume")
    n0 = len(eng.submissions)
    ev = driver.run(eng, [r])["resume"]
    subs = eng.submissions[n0:]
    assert len(subs) == len(ev) >= 2  # one submission per segment
    assert all(s["prompt_tokens"] == len(r.prompt_token_ids) + sum(len(e.token_ids) for e in ev[:i])
               for i, s in enumerate(subs))
    # A cut submission can carry usage too (seen once in CI under load, with the new prompt's short plans;
    # not explained yet); the one that ends the plan always has it, and any count must be a valid one.
    assert subs[-1]["cached_tokens"] is not None
    assert all(s["cached_tokens"] is None or 0 <= s["cached_tokens"] <= s["prompt_tokens"] for s in subs)
    full = (subs[-1]["prompt_tokens"] // eng.block_size) * eng.block_size
    assert subs[-1]["cached_tokens"] >= full - eng.block_size > 0  # prompt and plan so far: a cache hit
    assert ev[-1].final and ev[-1].cached_prompt_tokens == subs[-1]["cached_tokens"]
    st = eng.stats()
    assert st.usage[-1].gen_id == "resume" and st.usage[-1].cached_tokens == subs[-1]["cached_tokens"]
    assert st.cached_prompt_tokens >= subs[-1]["cached_tokens"] and st.usage_reported >= 1


def test_a_suspended_generation_leaves_the_server(eng, pb, server):
    """Closing the stream at a boundary makes the server abort the request: with ignore_eos it would
    write all 1000 tokens if it kept running."""
    gen0 = _metric(server.url, "vllm:generation_tokens_total")
    r = _req(pb, "leave", max_new_tokens=1000, extra={"ignore_eos": True})
    eng.add(r)
    for _ in range(2000):
        if any(e.suspended for e in eng.step().events):
            break
    else:
        pytest.fail(f"no segment boundary in {eng.decode(r.output_token_ids)!r}")
    assert not eng.has_work() and not eng.backend_has_request("leave")
    end = time.monotonic() + 60
    while _metric(server.url, "vllm:num_requests_running") > 0 and time.monotonic() < end:
        time.sleep(0.2)
    assert _metric(server.url, "vllm:num_requests_running") == 0
    assert _metric(server.url, "vllm:generation_tokens_total") - gen0 < 200  # of the 1000 it was asked for


def test_abort_and_concurrent_constrained_generations(eng, pb):
    # It must still be running when aborted: a short plan was written whole before a step on a busy machine
    # collected its first token (CI, under a CPU hog), so it may not end on its own.
    a = _req(pb, "abort-me", suspend_at_boundary=False, max_new_tokens=1000, max_segment_tokens=1000,
             extra={"ignore_eos": True})
    eng.add(a)
    _run_until_tokens(eng, a, 1)
    eng.abort("abort-me")
    assert not eng.has_work() and not eng.backend_has_request("abort-me")
    eng.abort("abort-me")  # idempotent
    # Three generations at once, decoding constrained to the skill grammar (regex re-sent at every resume).
    reqs = [_req(pb, f"c{i}", task=t, extra={"regex": pb.regex}) for i, t in enumerate([CAT, BOY, CAT + " Hurry."])]
    events = driver.run(eng, reqs)
    for r in reqs:
        assert events[r.gen_id][-1].reason is FinishReason.STOP, events[r.gen_id][-1]
        assert pb.skillset.validate(concat_segments(events[r.gen_id]), complete=True) is None
    st = eng.stats()
    assert (st.running, st.waiting, st.max_batch) == (0, 0, 8)


def test_a_resumed_seeded_request_does_not_replay_its_random_draws(eng):
    """As the in-process engine: the seed of a resubmission is offset by the tokens already generated."""
    req = EngineRequest("g", [1, 2, 3], make_stop_checker("drone"), extra={"seed": 7, "temperature": 0.7})
    assert eng.request_body(req, req.all_token_ids, 10)["seed"] == 7
    req.output_token_ids = [5, 6, 7, 8]
    assert eng.request_body(req, req.all_token_ids, 10)["seed"] == 11
    assert "seed" not in eng.request_body(EngineRequest("h", [1], make_stop_checker("drone")), [1], 10)


def test_start_up_errors_name_the_problem(server):
    port = free_port()  # nothing listens there
    with pytest.raises(RemoteServerError, match=rf"vLLM server at http://127\.0\.0\.1:{port} is unreachable"):
        make_engine(CFG, url=f"http://127.0.0.1:{port}", connect_timeout_s=2)
    with pytest.raises(RemoteServerError, match=rf"serves \['{SERVED}'\], not the configured model 'llama-70b'"):
        make_engine(CFG, url=server.url, model="llama-70b")
    with pytest.raises(EngineConfigError, match="url required"):
        make_engine({"backend": "remote", "model": SERVED})


def test_prefix_caching_is_read_from_the_servers_metrics(server):
    """The check start-up makes, on the real server's /metrics and on the same text of a server without
    prefix caching (starting a third server only to be refused costs a minute of two shared cores)."""
    text = urllib.request.urlopen(f"{server.url}/metrics", timeout=10).read().decode()
    assert prefix_caching_problem(text) is None
    off = text.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    assert off != text
    assert "--enable-prefix-caching" in prefix_caching_problem(off)
    assert "vllm:cache_config_info" in prefix_caching_problem("# no vLLM here\n")


# -- a second server, hung and then killed mid-generation (last: the module's server is not touched) ------------------
@pytest.fixture(scope="module")
def victim(tmp_path_factory):
    srv = _start(tmp_path_factory, "vllm-victim")
    yield srv
    srv.stop()


def _run_until_final(eng, gid: str, limit_s: float):
    """Steps until the generation's final event; fails (never hangs) past ``limit_s``."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        for e in eng.step().events:
            if e.gen_id == gid and e.final:
                return e
    pytest.fail(f"{gid}: no final event within {limit_s:g} s")


def _long_request(pb, gid):
    """Hundreds of tokens whatever the model writes (prompt + 500 < max_model_len 2048): the server is still
    streaming when it is hit."""
    return _req(pb, gid, max_new_tokens=500, suspend_at_boundary=False, max_segment_tokens=1000,
                extra={"ignore_eos": True})


def _run_until_tokens(eng, req, n: int, limit_s: float = 120.0) -> None:
    end = time.monotonic() + limit_s
    while len(req.output_token_ids) < n:
        rep = eng.step()
        final = [e for e in rep.events if e.gen_id == req.gen_id and e.final]
        assert not final, f"{req.gen_id} ended early: {final[0].reason} {final[0].error}"
        assert time.monotonic() < end, f"{req.gen_id}: fewer than {n} tokens within {limit_s:g} s"


def test_a_server_that_stops_answering_or_dies_ends_the_generation_with_an_error(victim, pb):
    read_timeout = 3.0
    e = make_engine(CFG, url=victim.url, read_timeout_s=read_timeout, connect_timeout_s=2.0)
    try:
        # (c) hung: SIGSTOP holds the connection open and sends nothing; the read timeout ends it.
        hung = _long_request(pb, "hung")
        e.add(hung)
        _run_until_tokens(e, hung, 3)
        victim.pause()
        final = _run_until_final(e, "hung", read_timeout + 30)
        victim.resume()
        assert final.reason is FinishReason.ERROR and not final.suspended
        assert f"{victim.url} stopped answering: nothing for 3 s (read_timeout_s) after" in final.error, final.error
        assert not e.has_work()
        # (c) killed mid-stream: the broken connection ends the generation.
        dead = _long_request(pb, "dead")
        e.add(dead)
        _run_until_tokens(e, dead, 3)
        victim.kill()
        final = _run_until_final(e, "dead", read_timeout + 30)
        assert final.reason is FinishReason.ERROR, final
        assert f"the connection to the server at {victim.url} broke after" in final.error, final.error
        assert "the server died or dropped the request" in final.error
        # A resume sent to the dead server ends at once, naming it.
        after = _req(pb, "after")
        e.add(after)
        final = _run_until_final(e, "after", read_timeout + 30)
        assert final.reason is FinishReason.ERROR and f"cannot connect to the server at {victim.url}" in final.error
        assert not e.has_work()
    finally:
        e.close()
