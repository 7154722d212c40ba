"""Where a MiniSpec plan so far stands, read with the language's own lexer (a brace in a string is no block).

A suspended generation resumes under a regex for the rest of its plan (grammar.continuation_regex); these
readings tell it how many statements are written, which blocks are open and what they hold.
"""

from __future__ import annotations

from timelyllm_ros.skills.lexer import Lexer


def need_scan(text: str, need: str, head: int) -> tuple[int, int | None, int, int, bool, int]:
    """For a MiniSpec plan so far: (statements written after the ``head`` ones, index among them of the first
    that calls ``need`` or None, blocks open, calls in the open block, whether the open block calls ``need``,
    calls in it after that call). A call cut at its ``)`` counts as written."""
    lx = Lexer()
    toks = [t for t in lx.feed(text) + lx.end() if t.kind != "eof"]
    done, first = 0, None
    depth = b = after = 0
    cur = in_blk = False  # the current top-level statement calls need / the open block does
    prev = None
    for i, t in enumerate(toks):
        is_call = t.kind == "ident" and i + 1 < len(toks) and toks[i + 1].value == "("
        if is_call and t.value == need:
            cur = True
            if depth > 0 and not in_blk:  # the block's calls after its first call of need (a later one counts)
                in_blk, after = True, -1
        if t.kind == "op" and t.value == "{":
            depth, b, after = depth + 1, 0, 0
        elif t.kind == "op" and t.value == "}":
            depth -= 1
            if depth == 0:
                done, first, cur, in_blk = _end_stmt(done, first, cur, head)
        elif t.kind == "op" and t.value == ";":
            if depth > 0:
                b += 1
                after += 1 if in_blk else 0
            elif not (prev is not None and prev.kind == "op" and prev.value == "}"):
                done, first, cur, in_blk = _end_stmt(done, first, cur, head)
        prev = t
    if text.rstrip().endswith(")"):  # a call cut before its ';'
        if depth > 0:
            b += 1
            after += 1 if in_blk else 0
        else:
            done, first, cur, in_blk = _end_stmt(done, first, cur, head)
    return max(0, done - head), (None if first is None else first - head), depth, b, in_blk, max(0, after)


def open_block(text: str) -> str | None:
    """What the block open at the end of a MiniSpec plan so far is: "loop" (``3{``), "True" or "False" (a test
    on that outcome); None when there is none to tell."""
    lx = Lexer()
    toks = [t for t in lx.feed(text) + lx.end() if t.kind != "eof"]
    opens = [i for i, t in enumerate(toks) if t.kind == "op" and t.value == "{"]
    if not opens or opens[-1] == 0:
        return None
    before = toks[opens[-1] - 1]
    if before.kind == "num":
        return "loop"
    return str(before.value) if str(before.value) in ("True", "False") else None


def open_loop(text: str) -> bool:
    """The block open at the end of a MiniSpec plan so far is a loop (``3{``), not a conditional."""
    return open_block(text) == "loop"


def _end_stmt(done: int, first: int | None, cur: bool, head: int) -> tuple[int, int | None, bool, bool]:
    if cur and first is None and done >= head:
        first = done
    return done + 1, first, False, False


def progress(text: str) -> tuple[int, int, int]:
    """(top-level statements written, blocks open, statements in the innermost open block), by the language's
    lexer (a brace in a string is no block). A call cut at its ``)`` counts as written."""
    lx = Lexer()
    top = depth = block = 0
    prev = ""
    for t in lx.feed(text) + lx.end():
        if t.kind != "op":
            if t.kind != "eof":
                prev = t.kind
            continue
        v = t.value
        if v == "{":
            depth, block = depth + 1, 0
        elif v == "}":
            depth -= 1
            if depth == 0:
                top += 1
        elif v == ";":
            if depth > 0:
                block += 1
            elif prev != "}":
                top += 1
        prev = v
    if text.endswith(")"):
        if depth > 0:
            block += 1
        else:
            top += 1
    return top, depth, block
