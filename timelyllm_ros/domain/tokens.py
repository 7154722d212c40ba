"""Token-id sequences: what prompts share (prefix-cache hits, placement on a pool)."""

from __future__ import annotations

from collections.abc import Sequence

_CHUNK = 64


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids two sequences share. Whole chunks are compared as slices (C speed): the
    scheduler matches every new prompt against each warmed prompt (~2k tokens, a few dozen of them)."""
    n = min(len(a), len(b))
    i = 0
    while i + _CHUNK <= n and a[i:i + _CHUNK] == b[i:i + _CHUNK]:
        i += _CHUNK
    return next((j for j in range(i, n) if a[j] != b[j]), n)
