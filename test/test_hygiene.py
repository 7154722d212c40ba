"""Input hygiene: refused characters are named with their code point, name and position."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from timelyllm_ros.planner.hygiene import char_name, check_text, check_token_count, fits_in_tokens

# The refused set, written out from the specification (not taken from the module under test).
REFUSED = (
    [chr(c) for c in range(0x00, 0x20) if c not in (0x09, 0x0A)]
    + ["\x7f"] + [chr(c) for c in range(0x80, 0xA0)]
    + [chr(c) for c in range(0x202A, 0x202F)] + [chr(c) for c in range(0x2066, 0x206A)]
    + ["\u200e", "\u200f", "\u061c", "\u2028", "\u2029"]
)


def _err(field: str, text: str, **kw) -> str:
    with pytest.raises(ValueError) as ei:
        check_text(field, text, **kw)
    return str(ei.value)


def test_escape_sequence_is_named_exactly():
    assert _err("task", "\x1b[2J") == "task: control character U+001B (ESCAPE) at position 0 is not allowed"


@pytest.mark.parametrize(("text", "code", "name", "pos"), [
    ("\x07", "U+0007", "BELL", 0),
    ("go\x00home", "U+0000", "NULL", 2),
    ("line one\r\nline two", "U+000D", "CARRIAGE RETURN", 8),
    ("abc\x7f", "U+007F", "DELETE", 3),
    ("x\x9b31m", "U+009B", "CONTROL SEQUENCE INTRODUCER", 1),
    ("\u202eevil", "U+202E", "RIGHT-TO-LEFT OVERRIDE", 0),
    ("find the cat\u202e", "U+202E", "RIGHT-TO-LEFT OVERRIDE", 12),
    ("\u2066x", "U+2066", "LEFT-TO-RIGHT ISOLATE", 0),
    ("mf(50);\u2066ml(90);", "U+2066", "LEFT-TO-RIGHT ISOLATE", 7),
    ("café 猫\u2066", "U+2066", "LEFT-TO-RIGHT ISOLATE", 6),
    ("a\u200fb", "U+200F", "RIGHT-TO-LEFT MARK", 1),
    ("a\u061c", "U+061C", "ARABIC LETTER MARK", 1),
    ("one\u2028two", "U+2028", "LINE SEPARATOR", 3),
    ("one\u2029", "U+2029", "PARAGRAPH SEPARATOR", 3),
])
def test_refused_characters(text, code, name, pos):
    msg = _err("task", text)
    assert msg.startswith("task: ")
    assert f"{code} ({name}) at position {pos} is not allowed" in msg


@pytest.mark.parametrize("text, code, name, pos", [("a\nb", "000A", "LINE FEED", 1), ("ab\t", "0009",
                                                                                    "CHARACTER TABULATION", 2)])
def test_an_id_refuses_tab_and_line_feed_too(text, code, name, pos):
    """Issue 39: a task_id with a newline was accepted (it forges a line in every log that names the task)."""
    assert _err("task_id", text, single_line=True) == (f"task_id: control character U+{code} ({name}) at position "
                                                       f"{pos} is not allowed")
    check_text("task", text)  # a task's own text may hold them


def test_first_offending_character_is_reported():
    assert "U+0007 (BELL) at position 1" in _err("scene", "a\x07\x1b")


def test_lone_surrogate_is_refused():
    msg = _err("task", "ok\ud800")
    assert "lone surrogate U+D800 (SURROGATE) at position 2" in msg and "UTF-8" in msg


@pytest.mark.parametrize("text", ["", "find the cat", "mf(50);\tml(90);\nd(1);", "café 猫", "Ünïcödé — “quotes” 🐈",
                                  "عربى", "\u00a0nbsp"])
def test_accepted(text):
    check_text("task", text)


def test_max_chars():
    check_text("task", "x" * 2000, max_chars=2000)
    assert _err("task", "x" * 2100, max_chars=2000) == "task: 2100 characters, more than max_chars=2000"


def test_non_string_is_a_type_error():
    with pytest.raises(TypeError, match="task"):
        check_text("task", b"cat")  # type: ignore[arg-type]


def test_token_count():
    check_token_count("task", 512, 512)
    check_token_count("task", 10_000, None)
    with pytest.raises(ValueError) as ei:
        check_token_count("task", 900, 512)
    assert str(ei.value) == "task: 900 tokens, more than max_task_tokens=512"
    with pytest.raises(ValueError, match=r"^scene: 70 tokens, more than scene_limit=64$"):
        check_token_count("scene", 70, 64, limit_name="scene_limit")


_TOKENIZER = None


def _model_tokenizer():
    global _TOKENIZER
    if _TOKENIZER is None:
        from transformers import AutoTokenizer

        from timelyllm_ros import paths

        _TOKENIZER = AutoTokenizer.from_pretrained(str(paths.share_dir() / "models" / "SmolLM2-135M-Instruct"))
    return _TOKENIZER


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=300))
def test_an_ascii_text_has_no_more_tokens_than_fits_in_tokens_assumes(text):
    """fits_in_tokens lets intake skip counting a task's tokens: never when the count could pass the limit. With
    the bundled model's tokenizer (start-of-text tokens included), an ASCII text's tokens never exceed its length
    plus 2."""
    tok = _model_tokenizer()
    n = len(tok.encode(text, add_special_tokens=True))
    assert n <= len(text) + 2
    for limit in (n - 1, n, n + 1, len(text) + 1, len(text) + 2):
        if limit >= 1 and fits_in_tokens(text, limit):
            assert n <= limit


def test_fits_in_tokens_counts_only_what_could_pass_the_limit():
    assert fits_in_tokens("find the cat", 14) and not fits_in_tokens("find the cat", 13)
    assert fits_in_tokens("x" * 5000, None)
    assert not fits_in_tokens("find the caf\u00e9", 1000)  # not ASCII: counted (a normaliser may expand it)
    assert not fits_in_tokens("\u337f", 1000)  # one character, four words under NFKC


def test_every_refused_character_has_a_name():
    for ch in REFUSED:
        assert char_name(ch) and char_name(ch) != "UNNAMED", hex(ord(ch))


_REFUSED_SET = frozenset(REFUSED)
allowed_text = st.text(st.characters(codec="utf-8", exclude_characters=_REFUSED_SET), max_size=60)
refused_char = st.one_of(st.sampled_from(REFUSED), st.integers(0xD800, 0xDFFF).map(chr))


@given(allowed_text)
def test_allowed_text_passes(text):
    check_text("task", text)


@given(allowed_text, refused_char, st.data())
def test_one_refused_character_is_found_where_it_was_inserted(text, bad, data):
    pos = data.draw(st.integers(0, len(text)), label="pos")
    s = text[:pos] + bad + text[pos:]
    msg = _err("task", s)
    assert re.fullmatch(rf"task: .+ U\+{ord(bad):04X} \(.+\) at position {pos} is not allowed.*", msg), msg
