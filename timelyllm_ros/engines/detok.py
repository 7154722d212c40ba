"""Incremental detokenization, one token at a time (design §5).

The stop checker must see the text of every new token. Decoding tokens one by
one is wrong for byte-level BPE: a multi-byte character can span several
tokens, and a token's leading space depends on its neighbours. We use the
prefix/read-offset window of vLLM and TGI: decode a short window ending at the
new token, emit the text that grew past the previously emitted part, and hold
a token back (emit "") while the window ends in an incomplete UTF-8 sequence.
The pieces therefore concatenate to ``tokenizer.decode(output_ids)``.

The state is seeded from the tail of the token ids already in the context, so
a resumed generation needs no detokenizer state from before its suspension.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_WINDOW = 6  # context tokens kept before the first unread token (as in vLLM)


class IncrementalDetokenizer:
    """Per-generation incremental detokenizer."""

    def __init__(self, tokenizer: Any, context_ids: Sequence[int] = (), skip_ids: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._skip = frozenset(skip_ids)  # e.g. EOS: ends the plan, has no text
        tail = list(context_ids[-_WINDOW:])
        self._ids: list[int] = tail
        self._prefix = 0  # window start
        self._read = len(tail)  # first token whose text is not emitted yet

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the new text it completes (may be "")."""
        if token_id in self._skip:
            return ""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        new_text = self._decode(self._ids[self._prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            piece = new_text[len(prefix_text):]
            self._prefix, self._read = self._read, len(self._ids)
            # Keep the window bounded: only ids[prefix:] are ever decoded again.
            if self._prefix > 4 * _WINDOW:
                del self._ids[:self._prefix]
                self._read -= self._prefix
                self._prefix = 0
            return piece
        return ""

    def push_many(self, token_ids: Sequence[int]) -> list[str]:
        return [self.push(t) for t in token_ids]
