"""The remote backend against a hostile OpenAI-compatible server (issue 23 items 5 and 7): garbage token ids,
keep-alives without tokens, a /v1/models that is no JSON.

The server is a scripted stand-in (stdlib HTTP, in-process): it answers the engine's start-up checks as vLLM
does (/v1/models, /metrics, /tokenize with the bundled model's tokenizer, a token-id completion) and streams
what each test scripts. The client, :class:`RemoteEngine`, is what is under test; the real server's behaviour
is test_engine_remote.py's (slow, marked ``engine``). Fast: no model weights, no vLLM.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from timelyllm_ros.engines.base import EngineRequest, FinishReason, SegmentEvent
from timelyllm_ros.engines.factory import EngineConfigError, make_engine, resolve_model_path
from timelyllm_ros.engines.remote_engine import RemoteServerError
from timelyllm_ros.skills.segmenter import make_stop_checker

SERVED = "fake-model"
PLAN = "tc(90);g('cat');"
TICK_S = 0.02  # between two streamed chunks
# Test limits: keep-alives come every TICK_S, far inside read_timeout_s: only the token deadlines can end a stream.
FIRST_TOKEN_S, TOKEN_S, READ_S = 1.5, 1.0, 0.5

Script = Callable[["_Handler", list[int]], Iterator[str]]  # yields SSE lines (without the blank separator)


def _chunk(toks, finish=None, **extra) -> str:
    return "data: " + json.dumps({"object": "text_completion", "model": SERVED, "choices": [
        {"index": 0, "text": "", "token_ids": toks, "finish_reason": finish, "stop_reason": None, **extra}]})


class _Handler(BaseHTTPRequestHandler):
    server: _FakeServer

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        srv = self.server
        if self.path == "/v1/models":
            if srv.models_body is not None:
                self._send(200, srv.models_body, "text/html")
            else:
                self._send(200, json.dumps({"object": "list", "data": [
                    {"id": SERVED, "root": "/nowhere", "max_model_len": 2048}]}).encode())
        elif self.path == "/metrics":
            self._send(200, b'vllm:cache_config_info{block_size="32",enable_prefix_caching="True"} 1.0\n'
                            b'vllm:kv_cache_usage_perc{engine="0"} 0.0\n', "text/plain")
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self._send(200, json.dumps({"tokens": srv.encode(body["prompt"])}).encode())
            return
        if self.path != "/v1/completions":
            self._send(404, b"{}")
            return
        prompt = body["prompt"]
        if not body.get("stream"):  # the start-up probe
            self._send(200, json.dumps({"choices": [{"text": "x", "token_ids": [42], "finish_reason": "length"}],
                                        "usage": {"prompt_tokens": len(prompt),
                                                  "prompt_tokens_details": {"cached_tokens": 0}}}).encode())
            return
        srv.streams.append(prompt)
        self.send_response(200)  # HTTP/1.0 without a length: the body ends when the connection closes
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for line in srv.scripts[prompt[0]](self, prompt):
                if srv.stopping.is_set():
                    return
                self.wfile.write(f"{line}\n\n".encode())
                time.sleep(TICK_S)
        except (BrokenPipeError, ConnectionResetError):  # the engine closed the stream
            pass


class _FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, tokenizer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.tok = tokenizer
        self.plan_ids = self.encode(PLAN)
        self.scripts: dict[int, Script] = {}  # by the prompt's first token id
        self.streams: list[list[int]] = []
        self.models_body: bytes | None = None  # set: /v1/models answers this (text/html) instead
        self.stopping = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def plan(self, prompt: list[int], base: int, upto: int | None = None) -> Iterator[str]:
        """The plan's tokens from where the prompt (``base`` ids, then the plan so far) left it, one a chunk,
        the first echoing the prompt; ``upto``: stop before the plan's token ``upto`` (the caller goes on)."""
        rest = self.plan_ids[len(prompt) - base:upto]
        for i, t in enumerate(rest):
            yield _chunk([t], **({"prompt_token_ids": prompt} if i == 0 else {}))
        if upto is None:
            yield _chunk([], "stop")
            yield "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": len(prompt)}})
            yield "data: [DONE]"


@pytest.fixture(scope="module")
def model_dir() -> str:
    pytest.importorskip("httpx")
    pytest.importorskip("transformers")
    try:
        return resolve_model_path("models/SmolLM2-135M-Instruct")
    except EngineConfigError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def fake(model_dir):
    from transformers import AutoTokenizer

    srv = _FakeServer(AutoTokenizer.from_pretrained(model_dir))
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.stopping.set()
    srv.shutdown()
    srv.server_close()
    thread.join(5)


def _config(url: str, **kw) -> dict:
    return {"backend": "remote", "url": url, "model": SERVED, "tokenizer": "models/SmolLM2-135M-Instruct",
            "metrics_interval_s": 0, "connect_timeout_s": 2.0, "first_token_timeout_s": FIRST_TOKEN_S,
            "token_timeout_s": TOKEN_S, "read_timeout_s": READ_S, **kw}


@pytest.fixture(scope="module")
def eng(fake):
    fake.scripts[10] = lambda h, prompt: h.server.plan(prompt, 4)  # a well-behaved request
    e = make_engine(_config(fake.url))
    yield e
    e.close()


def _req(gid: str, first: int) -> EngineRequest:
    return EngineRequest(gid, [first, 1, 2, 3], make_stop_checker("drone"), max_new_tokens=64,
                         suspend_at_boundary=False)


def _run(eng, reqs: list[EngineRequest], limit_s: float = 20.0) -> dict[str, list[SegmentEvent]]:
    """Adds the requests and steps until each has its final event; fails (never hangs) past ``limit_s``."""
    for r in reqs:
        eng.add(r)
    events: dict[str, list[SegmentEvent]] = {r.gen_id: [] for r in reqs}
    end = time.monotonic() + limit_s
    while not all(evs and evs[-1].final for evs in events.values()):
        assert time.monotonic() < end, {g: [(e.reason, e.error) for e in evs] for g, evs in events.items()}
        for ev in eng.step().events:
            events[ev.gen_id].append(ev)
    return events


def _plan_done(evs: list[SegmentEvent]) -> None:
    assert evs[-1].reason is FinishReason.STOP, (evs[-1].reason, evs[-1].error)
    assert "".join(e.text for e in evs) == PLAN


@pytest.mark.parametrize("bad, says", [
    ([-1], "token id -1 (not in the vocabulary 0..49151)"),
    (["abc"], "token id 'abc' (not an integer)"),
    ([10**9], "token id 1000000000 (not in the vocabulary 0..49151)"),
    ([1.5], "token id '1.5' (not an integer)"),
    ("abc", "token_ids 'abc' (not a list of token ids)"),
])
def test_a_bad_token_id_fails_its_request_alone(eng, fake, bad, says):
    def garbage(h, prompt):  # two good tokens, the bad one, then more as if nothing happened
        yield from h.server.plan(prompt, 4, upto=2)
        yield _chunk(bad)
        yield from h.server.plan(prompt + h.server.plan_ids[:2], 4)

    fake.scripts[11] = garbage
    events = _run(eng, [_req("good", 10), _req("bad", 11)])
    _plan_done(events["good"])
    final = events["bad"][-1]
    assert final.reason is FinishReason.ERROR and not final.engine_failed  # a pool would not drop the member
    assert final.error.startswith(f"the server at {fake.url} sent {says} for request bad#"), final.error
    assert final.error.endswith("after 2 tokens"), final.error
    assert not eng.has_work() and not eng.backend_has_request("bad")
    _plan_done(_run(eng, [_req("after", 10)])["after"])  # the engine serves on


def _keep_alives(tokens: int) -> Script:
    def script(h, prompt):  # ``tokens`` tokens, then lines without any, for as long as the client listens
        yield from h.server.plan(prompt, 4, upto=tokens)
        while True:
            yield ": keep-alive"
            yield _chunk([])
            yield "data: "
            yield "data: " + json.dumps({"choices": []})
    return script


@pytest.mark.parametrize("tokens, limit, what", [(0, FIRST_TOKEN_S, "first_token_timeout_s"),
                                                 (3, TOKEN_S, "token_timeout_s")])
def test_keep_alives_without_tokens_end_the_request_at_its_token_deadline(eng, fake, tokens, limit, what):
    fake.scripts[12] = _keep_alives(tokens)
    t0 = time.monotonic()
    events = _run(eng, [_req("good", 10), _req("idle", 12)], limit_s=limit + 10)
    took = time.monotonic() - t0
    _plan_done(events["good"])
    final = events["idle"][-1]
    assert final.reason is FinishReason.ERROR, final
    new = "new " if tokens else ""
    assert final.error.startswith(f"the server at {fake.url} sent no {new}token for {limit:g} s ({what}) for "
                                  f"request idle#"), final.error
    assert f"after {tokens} tokens, only " in final.error and "line(s) without tokens" in final.error
    assert final.engine_failed  # the server is hung for this request: a pool moves it to another member
    assert limit * 0.9 <= took < limit + 5, took
    assert not eng.has_work()
    _plan_done(_run(eng, [_req("after", 10)])["after"])


def test_token_timeout_must_be_positive(fake):
    for bad in (0, -1.0, float("nan")):
        with pytest.raises((EngineConfigError, ValueError), match="token_timeout_s"):
            make_engine(_config(fake.url, token_timeout_s=bad))


def test_a_models_answer_that_is_no_json_names_the_url_and_what_came(fake):
    fake.models_body = b"<html><body>502 Bad Gateway</body></html>"
    try:
        with pytest.raises(RemoteServerError) as ei:
            make_engine(_config(fake.url))
    finally:
        fake.models_body = None
    assert str(ei.value) == (f"{fake.url}/v1/models answered HTTP 200 with no JSON object (text/html): "
                             f"'<html><body>502 Bad Gateway</body></html>'; is this a vLLM OpenAI-compatible "
                             f"server?"), str(ei.value)
