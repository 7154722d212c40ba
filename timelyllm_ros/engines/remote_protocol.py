"""What a :class:`~timelyllm_ros.engines.remote_engine.RemoteEngine` speaks with a vLLM server, apart from the
streams themselves: the start-up checks (:class:`ServerChecks`: the served model, its prefix caching and block
size from ``/metrics``, the tokenizer, a token-id completion), and reading what the server answers (its metrics,
error bodies, the model's EOS ids).
"""

from __future__ import annotations

import concurrent.futures
import json
import re
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

# Tokenized by the local tokenizer and by the server's: the two must agree (plain text, MiniSpec, unicode).
TOKENIZER_PROBE = "Scene: [cat x:0.5] Task: find the cat. Plan: ?s('cat')==True{g('cat');tc(90);} Grüße 東京"

# Every sampling field the server could otherwise fill in from the model's generation_config
# (CompletionRequest._DEFAULT_SAMPLING_PARAMS: "user -> server default -> OpenAI default"): set them all,
# so the server decodes exactly like the in-process backend (SamplingParams defaults, greedy).
NEUTRAL_SAMPLING = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                    "frequency_penalty": 0.0}

_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>.*)\}\s+\S+\s*$", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
KV_USAGE = re.compile(r"^vllm:kv_cache_usage_perc\{[^}]*\}\s+(\S+)", re.MULTILINE)


class RemoteServerError(RuntimeError):
    """The server cannot serve this engine (unreachable, another model, no prefix caching, ...)."""


class ServerChecks:
    """The start-up checks of the server at ``url`` for ``model``, over ``client`` (an ``httpx.AsyncClient``
    whose coroutines ``call`` runs on the engine's event loop, waiting at most ``timeout_s`` for each)."""

    def __init__(self, url: str, model: str, client: Any, call: Callable[[Coroutine, float], Any],
                 timeout_s: float) -> None:
        self.url, self.model, self.client, self.call, self.timeout_s = url, model, client, call, timeout_s

    async def _get(self, path: str) -> Any:
        return await self.client.get(path)

    async def _post(self, path: str, body: dict) -> Any:
        return await self.client.post(path, json=body)

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        import httpx

        coro = self._get(path) if method == "GET" else self._post(path, body or {})
        try:
            resp = self.call(coro, self.timeout_s)
        except (httpx.HTTPError, OSError, concurrent.futures.TimeoutError) as e:
            raise RemoteServerError(
                f"vLLM server at {self.url} is unreachable ({method} {path}: {type(e).__name__}: {e}); "
                f"start it (vllm serve ... --host/--port) or correct `url` in the engine config") from None
        return resp

    def json(self, resp: Any, path: str) -> dict:
        """The JSON object of a start-up answer; anything else names the URL and what came back."""
        try:
            obj = resp.json()
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            kind = resp.headers.get("content-type") or "no content-type"
            raise RemoteServerError(f"{self.url}{path} answered HTTP {resp.status_code} with no JSON object "
                                    f"({kind}): {resp.text[:200]!r}; is this a vLLM OpenAI-compatible server?")
        return obj

    def served_model(self) -> tuple[str | None, Any]:
        """The configured model's entry in ``/v1/models``: its ``root`` (the folder it was loaded from) and
        ``max_model_len``."""
        resp = self.request("GET", "/v1/models")
        if resp.status_code != 200:
            raise RemoteServerError(f"{self.url}/v1/models answered HTTP {resp.status_code}: {resp.text[:300]}; "
                                    f"is this a vLLM OpenAI-compatible server?")
        data = self.json(resp, "/v1/models").get("data")
        served = {m.get("id"): m for m in data if isinstance(m, dict)} if isinstance(data, list) else {}
        entry = served.get(self.model)
        if entry is None:
            raise RemoteServerError(f"the server at {self.url} serves {sorted(served)}, not the configured model "
                                    f"{self.model!r} (`model` must be the server's --served-model-name)")
        return entry.get("root"), entry.get("max_model_len")

    def block_size(self) -> int:
        """The server's KV block size (0: unknown); RemoteServerError if it does not cache prefixes."""
        resp = self.request("GET", "/metrics")
        text = resp.text if resp.status_code == 200 else ""
        problem = prefix_caching_problem(text)
        if problem:
            raise RemoteServerError(f"the server at {self.url}: {problem}")
        return int((cache_config_info(text) or {}).get("block_size") or 0)

    def load_tokenizer(self, tokenizer: str | None, root: str | None) -> tuple[Any, str]:
        from transformers import AutoTokenizer

        path = tokenizer
        if path is None:
            if root and (Path(root) / "tokenizer_config.json").is_file():
                path = root  # the server runs on this machine from a local folder: the same files
            else:
                raise RemoteServerError(
                    f"set `tokenizer` in the engine config: a local folder with the tokenizer of the model the "
                    f"server at {self.url} serves (its folder there, {root!r}, is not readable here)")
        return AutoTokenizer.from_pretrained(path), str(path)

    def check_tokenizer(self, local: list[int], tokenizer_path: str, root: str | None) -> None:
        """``local``: the local tokenizer's ids of :data:`TOKENIZER_PROBE`; the server's must be the same."""
        resp = self.request("POST", "/tokenize",
                            {"model": self.model, "prompt": TOKENIZER_PROBE, "add_special_tokens": False})
        if resp.status_code != 200:
            raise RemoteServerError(f"{self.url}/tokenize answered HTTP {resp.status_code}: {resp.text[:300]}")
        remote = self.json(resp, "/tokenize").get("tokens")
        if remote != local:
            raise RemoteServerError(
                f"the local tokenizer {tokenizer_path} disagrees with the server's (model {root!r}) on "
                f"{TOKENIZER_PROBE!r}: {local} here, {remote} there; `tokenizer` must be the served model's")

    def probe_usage(self, ids: list[int]) -> bool:
        """One 1-token completion from token ids (``ids``: :data:`TOKENIZER_PROBE`'s): the path every request
        takes works, and whether the server reports cached prompt tokens (``usage.prompt_tokens_details``)."""
        resp = self.request("POST", "/v1/completions", {
            "model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "return_token_ids": True})
        if resp.status_code != 200:
            raise RemoteServerError(f"{self.url}/v1/completions refused a token-id prompt: HTTP "
                                    f"{resp.status_code}: {resp.text[:300]}")
        body = self.json(resp, "/v1/completions")
        if not body.get("choices") or body["choices"][0].get("token_ids") is None:
            raise RemoteServerError(f"the server at {self.url} returns no token ids (return_token_ids): "
                                    f"it is not a vLLM server of a version this backend speaks")
        return (body.get("usage") or {}).get("prompt_tokens_details") is not None


def cache_config_info(metrics_text: str) -> dict[str, str] | None:
    """The labels of vLLM's ``vllm:cache_config_info`` metric (its CacheConfig as strings, from
    v1/metrics/loggers.py ``log_metrics_info``) in a Prometheus ``/metrics`` text; None if absent."""
    m = _CACHE_INFO.search(metrics_text)
    return dict(_LABEL.findall(m.group("labels"))) if m else None


def prefix_caching_problem(metrics_text: str) -> str | None:
    """Why a server whose ``/metrics`` reads ``metrics_text`` cannot serve resumes from its prefix cache;
    None if it can."""
    cache = cache_config_info(metrics_text)
    if cache is None:
        return ("its /metrics has no vllm:cache_config_info (not a vLLM server, or started with "
                "--disable-log-stats): cannot tell whether it caches prefixes")
    if cache.get("enable_prefix_caching") != "True":
        return (f"it runs without prefix caching (vllm:cache_config_info enable_prefix_caching="
                f"{cache.get('enable_prefix_caching')!r}): every resumed segment would re-prefill its whole "
                f"context; start it with --enable-prefix-caching")
    return None


def error_message(body: str | dict) -> str:
    """The message of an OpenAI-style error body (``{"error": {"message": ...}}``), else the text."""
    obj = body
    if isinstance(body, str):
        try:
            obj = json.loads(body)
        except ValueError:
            return body[:300]
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err or obj)[:300]


def eos_token_ids(tokenizer: Any, folder: str) -> set[int]:
    """EOS ids of the model (generation_config.json, as vLLM reads them; else the tokenizer's)."""
    eos: Any = None
    gen = Path(folder) / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
    if eos is None:
        eos = tokenizer.eos_token_id
    return set(eos if isinstance(eos, list) else [eos]) - {None}
