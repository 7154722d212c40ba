"""Paper Table 1 on a GPU: Llama-3-8B-shaped decoder timings with transformers (no vLLM here).

The lent GPU machines have no network and no vLLM, and no 8B weights can be
carried there, so this measures the *architecture* with random bf16 weights:
timing does not depend on weight values. It reports prefill time for the
paper's 2884-token robot prompt, decode step time vs batch size, the KV-cache
size of one prompt, and reloading that KV cache from host memory vs
re-prefilling it — and fits the simulated engine's step-time model to it.

    python -m bench.gpu_llama_timing --out DIR [--layers 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192,
                 head_dim=128)


def _sync():
    import torch

    torch.cuda.synchronize()


def _timed(fn, repeats: int = 5, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    _sync()
    xs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=2884, help="robot prompt tokens (paper Table 1)")
    ap.add_argument("--batches", default="1,2,4,8,16")
    args = ap.parse_args(argv)

    import torch
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    assert torch.cuda.is_available(), "needs a CUDA GPU"
    dev = torch.device("cuda")
    cfg = LlamaConfig(**{**LLAMA3_8B, "num_hidden_layers": args.layers})
    t0 = time.perf_counter()
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    init_s = time.perf_counter() - t0
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "model": "Llama-3-8B architecture, random bf16 weights", "layers": args.layers,
                 "params_b": sum(p.numel() for p in model.parameters()) / 1e9, "init_s": init_s}
    gen = torch.Generator(device=dev).manual_seed(0)

    def ids(b: int, n: int):
        return torch.randint(0, cfg.vocab_size, (b, n), device=dev, generator=gen)

    with torch.inference_mode():
        prompt = ids(1, args.prompt)
        res["prefill_s"] = _timed(lambda: model(prompt, use_cache=True))
        out = model(prompt, use_cache=True)
        kv = out.past_key_values
        kv_bytes = sum(t.numel() * t.element_size() for layer in kv.layers for t in (layer.keys, layer.values))
        res["kv_bytes_per_prompt"] = kv_bytes
        # reload: the prompt's KV blocks from pinned host memory (the paper: 9.5 ms vs 133 ms re-prefill)
        host = [(layer.keys.to("cpu").pin_memory(), layer.values.to("cpu").pin_memory()) for layer in kv.layers]
        res["kv_reload_s"] = _timed(lambda: [(k.to(dev, non_blocking=True), v.to(dev, non_blocking=True))
                                             for k, v in host])
        res["reprefill_s"] = res["prefill_s"]
        one = ids(1, 1)
        res["decode_batch"] = {}
        for b in (int(x) for x in args.batches.split(",")):
            ctx = ids(b, 512)
            cache = DynamicCache()
            model(ctx, past_key_values=cache, use_cache=True)
            step = ids(b, 1) if b > 1 else one

            def decode(step=step, cache=cache):
                model(step, past_key_values=cache, use_cache=True)
                cache.crop(512)  # keep the context length fixed between repeats

            res["decode_batch"][b] = _timed(decode, repeats=10)
    bs = sorted(res["decode_batch"])
    d1 = res["decode_batch"][bs[0]]
    slope = statistics.fmean((res["decode_batch"][b] / d1 - 1) / (b - 1) for b in bs[1:]) if len(bs) > 1 else 0.0
    res["fit"] = {"decode_s": d1, "batch_slowdown": slope, "prefill_s_per_token": res["prefill_s"] / args.prompt}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_llama_timing.json").write_text(json.dumps(res, indent=1))
    lines = [f"# Llama-3-8B architecture on {res['gpu']} (transformers {__import__('transformers').__version__}, "
             f"torch {res['torch']}, random bf16 weights, {args.layers} layers)", "",
             "| quantity | this GPU | paper (RTX 4090, vLLM, fp16) |", "|---|---|---|",
             f"| prefill {args.prompt} prompt tokens | {res['prefill_s'] * 1e3:.1f} ms | 328 ms |",
             f"| decode step, batch 1 (512 context) | {d1 * 1e3:.1f} ms | ~22 ms |",
             f"| KV cache of one prompt | {kv_bytes / 2**20:.0f} MiB | 170 MB |",
             f"| KV reload from pinned host memory | {res['kv_reload_s'] * 1e3:.1f} ms | 9.5 ms |",
             f"| re-prefill of the same tokens | {res['reprefill_s'] * 1e3:.1f} ms | 133 ms |", "",
             "| batch | decode step ms |", "|---|---|"]
    lines += [f"| {b} | {res['decode_batch'][b] * 1e3:.2f} |" for b in bs]
    lines += ["", f"Fitted SimEngine step model: decode_s={d1:.4f}, batch_slowdown={slope:.4f}, "
              f"prefill_s_per_token={res['fit']['prefill_s_per_token']:.3g}"]
    (out_dir / "gpu_llama_timing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
