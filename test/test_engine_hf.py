"""transformers fallback engine with the bundled model (issue 4 §2, §5), plus fast
unit tests of the engine helpers (incremental detokenizer, skill regexes, prompts)."""

from __future__ import annotations

import re

import pytest

from timelyllm_ros.engines import driver
from timelyllm_ros.engines.base import EngineRequest, FinishReason, concat_segments
from timelyllm_ros.engines.detok import IncrementalDetokenizer
from timelyllm_ros.engines.factory import EngineConfigError, make_engine, resolve_model_path
from timelyllm_ros.engines.prompts import PromptBuilder
from timelyllm_ros.skills import grammar
from timelyllm_ros.skills.segmenter import make_stop_checker
from timelyllm_ros.skills.skill_files import load_skill_set

CAT = "Scene: [] Task: [A] Could you find the cat? If so, go to it."
BOY = ("Scene: [boy x:0.48 y:0.51 width:0.2 height:0.4] Task: [E] You provided me with plan mf,100, but I "
       "encountered a failure because a boy is passing by. Execution history: mf(50)")


@pytest.fixture(scope="module")
def tok():
    transformers = pytest.importorskip("transformers")
    try:
        path = resolve_model_path("models/SmolLM2-135M-Instruct")
    except EngineConfigError as e:
        pytest.skip(str(e))
    return transformers.AutoTokenizer.from_pretrained(path)


# -- fast unit tests ------------------------------------------------------------
def test_detok_pieces_concatenate(tok):
    for text in ["?iv('book')==True{g('book');}", "Grüße 東京 🚁 mf(50);  tc(90);", "d(3);mf(50);"]:
        ids = tok.encode(text, add_special_tokens=False)
        d = IncrementalDetokenizer(tok, tok.encode("Hello ", add_special_tokens=False), skip_ids=[2])
        pieces = d.push_many(ids + [2])
        assert "".join(pieces) == tok.decode(ids)
        assert pieces[-1] == ""  # EOS has no text


def test_int_range_regex_exact():
    for lo, hi in [(20, 500), (1, 360), (0, 60), (-5, 7), (7, 7)]:
        r = re.compile(grammar.int_range_regex(lo, hi))
        assert [v for v in range(-30, 1100) if r.fullmatch(str(v))] == list(range(lo, hi + 1))


@pytest.mark.parametrize("robot", ["drone", "arm"])
def test_plan_regex_accepts_only_valid_plans(robot):
    ss = load_skill_set(robot)
    r = re.compile(grammar.plan_regex(ss))
    good = {"drone": ["?s('cat')==True{g('cat');}", "tc(90);mf(50);", "d(2.5);mu(20);"],
            "arm": ["move_to('red_box');pick('red_box');move_to('tray');place('tray');"]}[robot]  # the arm's units
    bad = {"drone": ["mf(10);", "tc(400);", "fly(3);", "mf(50)"],
           "arm": ["move_to(0.9,0);", "pick(red);", "sc();move_to(0.45,-0.2);pick('red_box');"]}[robot]
    for p in good:
        assert r.fullmatch(p) and ss.validate(p, complete=True) is None, p
    for p in bad:
        assert not r.fullmatch(p), p


def test_continuation_regex_after_cut():
    ss = load_skill_set("drone")
    assert re.fullmatch(grammar.continuation_regex(ss, "?s('cat')==True{"), "g('cat');}")
    assert re.fullmatch(grammar.continuation_regex(ss, "tc(90)"), ";mf(50);")
    assert re.fullmatch(grammar.continuation_regex(ss, "tc(90);"), "")


@pytest.mark.parametrize("robot,task", [("drone", CAT), ("drone", BOY), ("arm", "Put the red box on the blue box.")])
def test_aligned_prompts_start_the_task_turn_on_a_cache_block(tok, robot, task):
    """A prefix cache keeps whole blocks: unaligned, the block where the examples end and the task begins was
    prefilled again for every task (26 of an emergency's 95 uncached tokens). Aligned, a task shares whole blocks
    with the warm-up prompt of its examples up to its own turn, and the padding is newlines only."""
    from timelyllm_ros.domain.tokens import common_prefix_len
    from timelyllm_ros.engines.prompts import WARM_UP_TASK

    plain, aligned = PromptBuilder(tok, robot), PromptBuilder(tok, robot, align_tokens=32)
    examples = plain.library.select(task)
    ids, ids32 = plain.token_ids(task), aligned.token_ids(task)
    turn = len(tok.encode(plain.user_text(task), add_special_tokens=False))
    head = [i for i, t in enumerate(ids32) if t == tok.convert_tokens_to_ids("<|im_start|>")][-2]  # the task's turn
    assert head % 32 == 0
    pad = len(ids32) - len(ids)
    assert 0 <= pad < 32 and ids32[head - pad:head] == [tok.encode("\n", add_special_tokens=False)[0]] * pad
    assert ids32[:head - pad] + ids32[head:] == ids  # only the padding differs
    def uncached(b: PromptBuilder, p: list[int]) -> int:  # what a prefix cache holding the warm-up prompt lacks
        return len(p) - common_prefix_len(b.token_ids(WARM_UP_TASK, examples=examples), p) // 32 * 32

    assert uncached(aligned, ids32) == len(ids32) - head <= turn + 10  # the turn, its header and the assistant's
    # Unaligned, the block boundary falls anywhere in the examples' last block: up to 31 tokens of them prefilled
    # again. Only where it falls inside the opening the task's turn shares with the warm-up's ("<|im_start|>user\n
    # Scene: [") does the plain prompt cache those few tokens more (drone-task1 after issue 38's examples: 72 vs 74)
    shared = common_prefix_len(aligned.token_ids(WARM_UP_TASK, examples=examples), ids32) - head
    assert 0 <= shared < 32 and uncached(aligned, ids32) <= uncached(plain, ids) + shared
    with pytest.raises(ValueError, match="align_tokens"):
        PromptBuilder(tok, robot, align_tokens=0)
    assert PromptBuilder(tok, robot, align_tokens=1).token_ids(task) == ids


def test_a_task_tokenizes_its_own_turn_to_the_ids_of_the_whole_prompt(tok):
    """The turns before the task's are tokenized once per example set (PromptBuilder._head); a task's prompt
    is then those ids and its own turn's, equal to the whole prompt tokenized, for every template and robot."""
    from timelyllm_ros.domain.plans import plan_templates

    for robot in ("drone", "arm", "chatbot"):
        for align in (None, 32):
            b = PromptBuilder(tok, robot, align_tokens=align)
            tasks = [t.task_input for t in plan_templates().values() if t.robot_type == robot] or [
                "Put the cup in the bin.", "Tell me a story about a robot."]
            for task in tasks + [t + " Then come back, twice." for t in tasks]:
                msgs = b.messages(task)
                whole = tok.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                                   add_special_tokens=False)
                head = len(tok.encode(tok.apply_chat_template(msgs[:-1], tokenize=False), add_special_tokens=False))
                first = b.token_ids(task)  # the example set's first task: split checked against the whole
                assert first == b.token_ids(task) == (b._align(whole, head) if align else whole), (robot, task)
            assert any(h is not None for h in b._heads.values()), robot  # the split was taken, not skipped


def test_prompt_layout(tok):
    pb = PromptBuilder(tok, "drone")
    text = pb.render(CAT)
    assert text.endswith("<|im_start|>assistant\n")  # the plan so far is the assistant's answer
    assert "mf(distance" in text and "Task: [A] Could you find the cat?" in text
    assert pb.render(CAT, plan_so_far="tc(90);").endswith("assistant\ntc(90);")
    for robot in ("arm", "chatbot"):
        assert PromptBuilder(tok, robot).token_ids("Put the cup in the bin.")


# -- real transformers engine -----------------------------------------------------
@pytest.fixture(scope="module")
def eng(tok):
    e = make_engine("config/engine_transformers_cpu.yaml")
    yield e
    e.close()


@pytest.fixture(scope="module")
def pb(eng):
    return PromptBuilder(eng.tokenizer, "drone")


def _req(pb, gid, task=CAT, **kw):
    return EngineRequest(gid, pb.token_ids(task), make_stop_checker(pb.skillset), max_new_tokens=40, **kw)


@pytest.mark.engine
def test_hf_segments_parse_and_match_unsegmented(eng, pb):
    seg, whole = _req(pb, "hs"), _req(pb, "hw", suspend_at_boundary=False)
    ev_s = driver.run(eng, [seg])["hs"]
    ev_w = driver.run(eng, [whole])["hw"]
    segs = [e for e in ev_s if e.reason is FinishReason.SEGMENT]
    assert len(segs) >= 2, [e.text for e in ev_s]
    for e in segs:
        assert pb.skillset.parse(e.text), e.text
    assert seg.output_token_ids == whole.output_token_ids
    assert concat_segments(ev_s) == concat_segments(ev_w) == eng.decode(seg.output_token_ids)


@pytest.mark.engine
def test_hf_resume_reuses_kv_cache(eng, pb):
    r = _req(pb, "hr")
    ev = driver.run(eng, [r])["hr"]
    assert len(ev) >= 2
    resumed = [s for s in eng.submissions if s["gen_id"] == "hr"][1:]
    assert resumed
    for s in resumed:  # everything but the boundary token comes from the kept cache
        assert s["cached_tokens"] == s["prompt_tokens"] - 1
    assert all(e.cached_prompt_tokens > 0 for e in ev[1:])


@pytest.mark.engine
def test_hf_abort_frees(eng, pb):
    r = _req(pb, "ha")
    eng.add(r)
    while "ha" in eng.running_ids():
        eng.step()
    assert "ha" in eng.suspended_ids()  # suspended at a boundary, cache kept
    eng.abort("ha")
    assert "ha" not in eng.suspended_ids() and not eng.has_work()
    r2 = _req(pb, "hb", suspend_at_boundary=False)
    eng.add(r2)
    eng.step()
    eng.abort("hb")
    assert eng.stats().running == 0 and not eng.has_work()


@pytest.mark.engine
def test_hf_concurrent_suspended_holds_no_slot(eng, pb):
    a, b = _req(pb, "ca"), _req(pb, "cb", task=BOY, suspend_at_boundary=False)
    eng.add(a)
    eng.add(b)
    suspended, after = False, 0
    while eng.has_work():
        rep = eng.step()
        if any(e.gen_id == "ca" and e.suspended for e in rep.events):
            suspended = True
            continue
        if suspended:
            assert rep.batch_size == 1 and "ca" not in eng.running_ids()
            after += rep.new_tokens
    assert suspended and after >= 3
    assert driver.run(eng, [a])["ca"][-1].final
