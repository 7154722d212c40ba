"""Per-robot-type prompts (config/prompts/<robot_type>.yaml), rendered with the
model's chat template.

Layout of a rendered prompt (design §5):

* system turn: the planner's role, the skill set description
  (:meth:`SkillSet.describe_for_prompt`) and the guidance;
* few-shot examples as earlier user / assistant turns: the ``shots`` examples of the robot type's library
  (``examples:``) most similar to the task (:class:`ExampleLibrary`), in library order, so that tasks
  that draw the same examples share the prompt prefix in the engine's prefix cache;
* the task's scene and instruction as the last user turn;
* the plan so far as the assistant's partial answer: the prompt ends right
  after the assistant header, and the engine appends the generated token ids
  (never re-tokenized text) when it resumes a generation.

:class:`PromptRenderer` is what a planner uses: task text to the prompt token
ids and request extras that one engine needs, per robot type, by what the
engine declares in its :class:`~timelyllm_ros.engines.base.EngineInfo`.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timelyllm_ros import paths
from timelyllm_ros.engines.base import Engine
from timelyllm_ros.skills import grammar
from timelyllm_ros.skills.schema import SkillSet
from timelyllm_ros.skills.skill_files import load_skill_set
from timelyllm_ros.yamlfile import YamlFileError, load_yaml_file

_SCENE_TASK = re.compile(r"^\s*Scene:\s*(?P<scene>\[.*?\])\s*,?\s*Task:\s*(?P<task>.*)$", re.S)


class PromptConfigError(ValueError):
    pass


class TaskPromptError(ValueError):
    """A task this engine cannot take (the request's fault, not the configuration's); names the field."""


def prompts_dir() -> Path:
    return paths.config_dir() / "prompts"


@dataclass
class PromptConfig:
    robot_type: str
    skill_set: str
    system: str
    guidance: list[str] = field(default_factory=list)
    user_template: str = "Scene: {scene} Task: {task}"
    examples: list[dict[str, str]] = field(default_factory=list)
    shots: int | None = None  # examples per task, the most similar of ``examples``; None: all of them
    path: Path | None = None

    @classmethod
    def load(cls, robot_type_or_path: str | Path) -> PromptConfig:
        p = Path(robot_type_or_path)
        if not p.suffix:
            p = prompts_dir() / f"{robot_type_or_path}.yaml"
        if not p.is_file():
            avail = sorted(x.stem for x in prompts_dir().glob("*.yaml"))
            raise PromptConfigError(f"no prompt config {p} (available: {avail})")
        try:
            raw = load_yaml_file(p) or {}
        except YamlFileError as e:
            raise PromptConfigError(str(e)) from None
        if not isinstance(raw, dict):
            raise PromptConfigError(f"{p}: expected a mapping")
        missing = [k for k in ("robot_type", "skill_set", "system") if k not in raw]
        if missing:
            raise PromptConfigError(f"{p}: missing keys {missing}")
        unknown = set(raw) - {f for f in cls.__dataclass_fields__ if f != "path"}
        if unknown:
            raise PromptConfigError(f"{p}: unknown keys {sorted(unknown)}")
        for i, ex in enumerate(raw.get("examples") or []):
            if not isinstance(ex, dict) or not {"input", "plan"} <= set(ex) <= {"input", "plan", "family"}:
                raise PromptConfigError(f"{p}: examples[{i}] must have 'input' and 'plan' (and a 'family')")
        raw["guidance"] = list(raw.get("guidance") or [])
        for i, g in enumerate(raw["guidance"]):
            if not isinstance(g, str):  # `- check it: ?iv(...)` is a YAML mapping, and its repr reached the prompt
                raise PromptConfigError(f"{p}: guidance[{i}] must be a string, got {type(g).__name__} "
                                        f"(quote an item that contains ': ')")
        raw["examples"] = list(raw.get("examples") or [])
        shots = raw.get("shots")
        if shots is not None and (not isinstance(shots, int) or isinstance(shots, bool) or shots < 1):
            raise PromptConfigError(f"{p}: shots must be an integer >= 1 (examples per task), got {shots!r}")
        return cls(**raw, path=p)


_TAG = re.compile(r"^\s*(\[[A-Z]\])")
_WORDS = re.compile(r"[a-z][a-z0-9]*")
# Only the emptiest words: "then" and "finally" tell how many objects a task moves, idf weighs the rest.
_FILLER = frozenset("a an the and it its to of is are".split())
# Words of robot tasks that mean the same thing to a plan ("fly up" and "move up", "photo" and "picture").
_SAME = {w: group.split()[0] for group in (
    "move fly go rise climb ascend descend lower lift raise travel head",
    "up upward upwards higher above top",
    "down downward downwards below under underneath beneath bottom",
    "photo picture photograph snapshot image shot",
    "find search look locate seek scan",
    "tell report answer say inform",
) for w in group.split()}


def _terms(task_input: str) -> list[str]:
    """The words of a task that say what it is about: its tag ([E], [Q], [A]) and its task text's words
    (a scene lists objects, which say little about the kind of task)."""
    m = _SCENE_TASK.match(task_input)
    text = m["task"] if m else task_input
    tag = _TAG.match(text)
    words = [_SAME.get(w, w) for w in _WORDS.findall(text.lower()) if w not in _FILLER]
    return ([tag[1]] if tag else []) + words


class ExampleLibrary:
    """Few-shot examples chosen per task by similarity to it (cosine of tf-idf word vectors; the tag
    [E]/[Q]/[A] is a word), returned in library order.

    Examples come in families (``family:``, e.g. evasion, photo, question): a task gets every example of the
    ``shots`` families whose best example is most similar to it. Choosing whole families keeps the prompts
    few (one per set of families, :meth:`combinations`), so the planner's warm-up leaves every one of them in
    the prefix cache and a task prefills only its own turn. Without families, ``shots`` is the number of
    examples (None: all of them)."""

    def __init__(self, examples: list[dict[str, str]], shots: int | None) -> None:
        self.examples = examples
        self.shots = shots
        self.families = list(dict.fromkeys(ex["family"] for ex in examples if "family" in ex))
        if self.families and len(self.families) != len({ex.get("family") for ex in examples}):
            raise PromptConfigError("examples: give every example a family, or none")
        docs = [Counter(_terms(ex["input"])) for ex in examples]
        df = Counter(w for d in docs for w in d)
        n = len(docs)
        self._idf = {w: math.log((1 + n) / (1 + c)) + 1.0 for w, c in df.items()}
        self._vecs = [self._vec(d) for d in docs]

    def _vec(self, counts: Counter[str]) -> dict[str, float]:
        v = {w: c * self._idf.get(w, math.log(1 + len(self.examples)) + 1.0) for w, c in counts.items()}
        norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
        return {w: x / norm for w, x in v.items()}

    def _groups(self) -> list[list[int]]:
        if self.families:
            return [[i for i, ex in enumerate(self.examples) if ex["family"] == f] for f in self.families]
        return [[i] for i in range(len(self.examples))]

    def select(self, task_input: str) -> list[dict[str, str]]:
        groups = self._groups()
        if self.shots is None or self.shots >= len(groups):
            return list(self.examples)
        q = self._vec(Counter(_terms(task_input)))
        score = [sum(q.get(w, 0.0) * x for w, x in v.items()) for v in self._vecs]
        best = sorted(range(len(groups)), key=lambda g: (-max(score[i] for i in groups[g]), g))[:self.shots]
        return [self.examples[i] for g in sorted(best) for i in groups[g]]

    def combinations(self) -> list[list[dict[str, str]]]:
        """Every example set :meth:`select` can return, with families (their number is bounded: C(families,
        shots)); without families, the set each example's own task draws (a neighbourhood of each)."""
        groups = self._groups()
        if self.shots is None or self.shots >= len(groups):
            return [list(self.examples)]
        if not self.families:
            return [self.select(ex["input"]) for ex in self.examples]
        return [[self.examples[i] for g in combo for i in groups[g]]
                for combo in itertools.combinations(range(len(groups)), self.shots)]


def cache_block_tokens(engine: Engine) -> int | None:
    """The block size to align prompts to: the engine's KV block where it reuses prompt prefixes; None where it
    does not (or has no prompt: the simulated engine)."""
    info = engine.info
    return info.kv_block_tokens if info.supports_prefix_cache and not info.needs_plan_text else None


class PromptBuilder:
    """Renders task prompts for one robot type with a given tokenizer."""

    def __init__(self, tokenizer: Any, robot_type: str | Path, skillset: SkillSet | None = None,
                 check_examples: bool = True, align_tokens: int | None = None) -> None:
        if align_tokens is not None and align_tokens < 1:
            raise ValueError(f"PromptBuilder: align_tokens must be >= 1 (or None), got {align_tokens!r}")
        self.tokenizer = tokenizer
        self.align_tokens = align_tokens if align_tokens and align_tokens > 1 else None
        # examples chosen -> the turns before the task's, as text and tokens (_head; one per few-shot family set)
        self._heads: dict[tuple[str, ...], tuple[str, list[int]] | None] = {}
        self._single: dict[str, int | None] = {}  # _one_token's answers
        self.config = PromptConfig.load(robot_type)
        self.skillset = skillset or load_skill_set(self.config.skill_set)
        if check_examples and self.skillset.grammar != "text":
            for ex in self.config.examples:  # a bad example teaches the model a bad plan
                err = self.skillset.validate(ex["plan"], complete=True)
                if err:
                    raise PromptConfigError(f"{self.config.path}: example plan {ex['plan']!r} does not parse: {err}")
        self.library = ExampleLibrary(self.config.examples, self.config.shots)

    @classmethod
    def for_engine(cls, engine: Engine, robot_type: str | Path, **kw: Any) -> PromptBuilder:
        """The builder a planner uses with ``engine``: its prompts aligned to the engine's prefix-cache blocks
        (:func:`cache_block_tokens`)."""
        return cls(engine.tokenizer, robot_type, align_tokens=cache_block_tokens(engine), **kw)

    def system_text(self) -> str:
        text = self.config.system.replace("{skills}", self.skillset.describe_for_prompt()).rstrip()
        if self.config.guidance:
            text += "\nGuidance:\n" + "\n".join(f"- {g}" for g in self.config.guidance)
        return text

    def user_text(self, task_input: str, scene: str | None = None) -> str:
        """The task turn. ``task_input`` may already be "Scene: [...] Task: ..." (LRTrace)."""
        m = _SCENE_TASK.match(task_input) if scene is None else None
        if m:
            scene, task = m["scene"], m["task"].strip()
        else:
            task = task_input.strip()
        return self.config.user_template.format(scene=scene or "[]", task=task).strip()

    def messages(self, task_input: str, scene: str | None = None,
                 examples: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system_text()}]
        if examples is None:
            examples = self.library.select(task_input if scene is None else f"Scene: {scene} Task: {task_input}")
        for ex in examples:
            msgs.append({"role": "user", "content": self.user_text(ex["input"])})
            msgs.append({"role": "assistant", "content": ex["plan"]})
        msgs.append({"role": "user", "content": self.user_text(task_input, scene)})
        return msgs

    def render(self, task_input: str, scene: str | None = None, plan_so_far: str = "",
               examples: list[dict[str, str]] | None = None) -> str:
        """Prompt text; ``plan_so_far`` becomes the start of the assistant's answer; ``examples``: these
        instead of the library's choice. Never aligned: the alignment is in tokens (:meth:`token_ids`)."""
        text = self.tokenizer.apply_chat_template(self.messages(task_input, scene, examples), tokenize=False,
                                                  add_generation_prompt=True)
        return text + plan_so_far

    def token_ids(self, task_input: str, scene: str | None = None,
                  examples: list[dict[str, str]] | None = None) -> list[int]:
        """Prompt token ids (the plan so far, if any, is appended by the engine as token ids). With
        ``align_tokens`` (the engine's KV block size), newline tokens between the last example and the task's
        turn make that turn start on a block boundary (:meth:`_align`)."""
        msgs = self.messages(task_input, scene, examples)
        text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        head = self._head(msgs, text)
        if head is None or not text.startswith(head[0]):
            return self._encode(text)  # no split that tokenizes as the whole does: nothing to align on either
        ids = head[1] + self._encode(text[len(head[0]):])
        return self._align(ids, len(head[1])) if self.align_tokens else ids

    def _encode(self, text: str) -> list[int]:
        # The chat template already contains the special tokens; do not add a BOS again.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _head(self, msgs: list[dict[str, str]], text: str) -> tuple[str, list[int]] | None:
        """The turns before the task's (the system prompt and examples: ~1.8k tokens) as text and token ids, so a
        task tokenizes only its own turn: the whole prompt took ~2 ms to tokenize, on the goal's thread, for
        every goal of a burst. Kept per example set once the split is seen to tokenize as the whole does (the
        task's turn opens with a special token); None where it does not (the whole prompt is tokenized)."""
        key = tuple(m["content"] for m in msgs[:-1])
        got = self._heads.get(key, False)  # renderers call this from several threads: one lookup
        if got is not False:
            return got
        ok = False
        if len(msgs) > 1:
            try:  # a chat template may refuse a conversation that ends on the assistant's turn
                head_text = self.tokenizer.apply_chat_template(msgs[:-1], tokenize=False)
            except Exception:  # noqa: BLE001 - then the whole prompt is tokenized, as before
                head_text = None
            if isinstance(head_text, str) and head_text:
                head_ids, whole = self._encode(head_text), self._encode(text)
                ok = (text.startswith(head_text) and whole[:len(head_ids)] == head_ids
                      and self._encode(text[len(head_text):]) == whole[len(head_ids):])
        if len(self._heads) >= 256:  # bounded: one entry per few-shot family set in practice
            self._heads.clear()
        got = self._heads[key] = (head_text, head_ids) if ok else None
        return got

    def _align(self, ids: list[int], head: int) -> list[int]:
        """Pad the ``head`` tokens before the task's turn to a whole number of KV blocks. A prefix cache holds whole
        blocks only, so the block where the examples end and the task begins is computed again for every task:
        on the bundled model and a 32-token block that was 26 of an emergency's 95 uncached prompt tokens.
        Aligned, only the task's own turn is prefilled. The padding is newlines between two turns; prompts
        whose chat template does not render the turns before the task as a prefix of the whole (:meth:`_head`)
        are left as they are."""
        pad = self._pad_id
        if pad is None:
            return ids
        return ids[:head] + [pad] * (-head % self.align_tokens) + ids[head:]

    @functools.cached_property
    def _pad_id(self) -> int | None:
        """The newline's token id, None where a newline is not one token (then nothing is aligned)."""
        return self._one_token("\n")

    def regex(self, plan_so_far: str = "") -> str | None:
        """Constrained-decoding regex for the rest of the plan, for no task in particular (None for prose)."""
        return grammar.continuation_regex(self.skillset, plan_so_far)

    def regex_for(self, task_input: str) -> Callable[[str], str | None]:
        """The constrained-decoding regex of this task's plan as a function of the plan so far (the engine
        calls it at every (re)submission): its objects and places only those the task and its scene name."""
        ss = self.skillset
        return lambda plan_so_far="": grammar.continuation_regex(ss, plan_so_far, task_input)

    def constraint_extra(self, task_input: str, token_grammar: bool) -> dict[str, Any]:
        """The request extras that constrain this task's plan: its regex (:meth:`regex_for`) and, for an engine
        that takes llguidance grammars, the grammar of the plan's start (:meth:`head_grammar_for`). Both are
        functions of the plan so far, evaluated at every (re)submission."""
        extra: dict[str, Any] = {"regex": self.regex_for(task_input)}
        head = self.head_grammar_for(task_input) if token_grammar else None
        if head is not None:
            extra["grammar"] = head
        return extra

    def head_grammar_for(self, task_input: str) -> Callable[[str], str | None] | None:
        """For an engine that takes llguidance grammars (``EngineInfo.token_grammar``): the grammar of this task's
        fresh plan with its first skill asked for as the one token the prompt spells it with
        (:func:`~timelyllm_ros.skills.grammar.plan_head`), as a function of the plan so far that gives None once
        the plan has begun (the regex of :meth:`regex_for` takes over). None when the plan may begin with any
        skill, or a skill it must begin with is not one token of this tokenizer."""
        head = grammar.plan_head(self.skillset, task_input)
        ids = [self._one_token(name) for name, _ in head]
        if not head or None in ids:
            return None
        text = lark_head_grammar([(i, rest) for i, (_, rest) in zip(ids, head, strict=True)])  # type: ignore[misc]
        return lambda plan_so_far="": None if plan_so_far.strip() else text

    def _one_token(self, text: str) -> int | None:
        # Asked for a plan's first skill names at every goal: kept (bounded by the skill set's names).
        if text in self._single:
            return self._single[text]
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        one = ids[0] if len(ids) == 1 and self.tokenizer.decode(ids) == text else None
        if len(self._single) < 1024:
            self._single[text] = one
        return one


def lark_head_grammar(heads: list[tuple[int, str]]) -> str:
    """An llguidance (Lark) grammar: one of the token ids, then the regex that goes with it."""
    rests: dict[str, list[int]] = {}
    for tok, rest in heads:
        rests.setdefault(rest, []).append(tok)
    alts, terms = [], []
    for k, (rest, toks) in enumerate(rests.items()):
        alts.append("(" + " | ".join(f"<[{t}]>" for t in toks) + f") REST{k}")
        terms.append(f"REST{k}: /" + rest.replace("/", "\\/") + "/")
    return "start: " + " | ".join(alts) + "\n" + "\n".join(terms) + "\n"


# Tokens a prompt must leave free in the model's context: a plan needs room for at least its first segment.
CONTEXT_MARGIN = 16
WARM_UP_TASK = "Scene: [] Task: [A] warm-up"


class PromptRenderer:
    """Task text -> (prompt token ids, request extras) for one engine, per robot type.

    Thread-safe (goal callbacks render concurrently). A simulated engine
    (``info.needs_plan_text``) has no prompt: the task's own tokens stand in for
    one (only their number matters) and the plan it will write is attached. A
    real engine gets the chat-template prompt of :class:`PromptBuilder`, plus the
    skill-grammar regex when decoding is ``constrained``; ``align``: the prompts aligned to the
    engine's prefix-cache blocks (:meth:`PromptBuilder.for_engine`; off only to compare).
    """

    def __init__(self, engine: Engine, constrained: bool = False, align: bool = True) -> None:
        self.constrained, self.align = constrained, align
        self._lock = threading.Lock()
        self._builders: dict[str, PromptBuilder] = {}
        self._engine = engine

    @property
    def engine(self) -> Engine:
        return self._engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self.replace_engine(engine)

    def replace_engine(self, engine: Engine) -> None:
        """A replacement engine (after a restart): builders are rebuilt with its tokenizer."""
        with self._lock:
            self._engine, self._builders = engine, {}

    def builder(self, robot_type: str) -> PromptBuilder:
        with self._lock:
            b = self._builders.get(robot_type)
            if b is None:
                b = self._builders[robot_type] = (PromptBuilder.for_engine(self._engine, robot_type) if self.align
                                                  else PromptBuilder(self._engine.tokenizer, robot_type))
            return b

    def count_tokens(self, text: str) -> int:
        """Length of ``text`` in the engine's tokens (for limits stated in tokens)."""
        return len(self._engine.tokenize(text))

    def token_ids(self, robot_type: str, task: str) -> list[int]:
        if self._engine.info.needs_plan_text:
            return self._engine.tokenize(task)
        return self.builder(robot_type).token_ids(task)

    def render(self, robot_type: str, task: str) -> tuple[list[int], dict[str, Any]]:
        """The prompt token ids and the request extras for ``task``. TaskPromptError when the engine cannot
        take it (the prompt overflows the model's context; the simulated engine has no plan for it)."""
        info = self._engine.info
        ids = self.token_ids(robot_type, task)
        if info.max_model_len and len(ids) + CONTEXT_MARGIN > info.max_model_len:
            raise TaskPromptError(f"task: the prompt is {len(ids)} tokens, too long for the model's context "
                                  f"of {info.max_model_len} tokens")
        extra: dict[str, Any] = {}
        if info.needs_plan_text:
            from timelyllm_ros.engines.sim_realtime import sim_plan_for

            try:
                extra["plan_text"] = sim_plan_for(robot_type, task)
            except ValueError as e:
                raise TaskPromptError(str(e)) from None
        elif self.constrained:
            extra |= self.builder(robot_type).constraint_extra(task, info.token_grammar)
        return ids, extra

    def warm_up_extra(self, robot_type: str) -> dict[str, Any]:
        """Request extras of a warm-up prompt: the robot type's grammar when decoding is constrained, so the
        engine's structured-output backend is set up before the first task, not during it."""
        if self._engine.info.needs_plan_text or not self.constrained:
            return {}
        return {"regex": self.builder(robot_type).regex_for(WARM_UP_TASK)}

    def warm_up_prompts(self, robot_types: list[str], burst: int = 8,
                        ) -> tuple[list[tuple[str, list[int]]], list[tuple[str, list[int]]]]:
        """Throw-away prompts for :func:`planner.warmup.warm_up`: per robot type, one for each example set a task
        can draw (:meth:`ExampleLibrary.combinations`: the skill catalogue and those examples then sit in the
        prefix cache), and a burst of up to ``burst`` (never more than the engine's batch) of the first robot
        type, of different lengths. None for a simulated engine: it has no prompt to warm."""
        if self._engine.info.needs_plan_text or not robot_types:
            return [], []
        singles = []
        for rt in robot_types:
            b = self.builder(rt)
            singles += [(rt, ids) for ids in dict.fromkeys(
                tuple(b.token_ids(WARM_UP_TASK, examples=exs)) for exs in b.library.combinations())]
        rt = robot_types[0]
        n = min(burst, max(1, int(self._engine.stats().max_batch)))
        batch = [(rt, self.token_ids(rt, f"{WARM_UP_TASK} {i}: " + "look around " * i)) for i in range(n)]
        return [(rt, list(ids)) for rt, ids in singles], batch
