"""Per-robot-type prompts (config/prompts/<robot_type>.yaml), rendered with the
model's chat template.

Layout of a rendered prompt (design §5, issue 4 §3):

* system turn: the planner's role, the skill set description
  (:meth:`SkillSet.describe_for_prompt`) and the guidance;
* few-shot examples as earlier user / assistant turns;
* the task's scene and instruction as the last user turn;
* the plan so far as the assistant's partial answer: the prompt ends right
  after the assistant header, and the engine appends the generated token ids
  (never re-tokenized text) when it resumes a generation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from timelyllm_ros import paths
from timelyllm_ros.skills import grammar
from timelyllm_ros.skills.schema import SkillSet, load_skill_set

_SCENE_TASK = re.compile(r"^\s*Scene:\s*(?P<scene>\[.*?\])\s*,?\s*Task:\s*(?P<task>.*)$", re.S)


class PromptConfigError(ValueError):
    pass


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
    path: Path | None = None

    @classmethod
    def load(cls, robot_type_or_path: str | Path) -> PromptConfig:
        p = Path(robot_type_or_path)
        if not p.suffix:
            p = prompts_dir() / f"{robot_type_or_path}.yaml"
        if not p.is_file():
            avail = sorted(x.stem for x in prompts_dir().glob("*.yaml"))
            raise PromptConfigError(f"no prompt config {p} (available: {avail})")
        raw = yaml.safe_load(p.read_text()) or {}
        if not isinstance(raw, dict):
            raise PromptConfigError(f"{p}: expected a mapping")
        missing = [k for k in ("robot_type", "skill_set", "system") if k not in raw]
        if missing:
            raise PromptConfigError(f"{p}: missing keys {missing}")
        unknown = set(raw) - {f for f in cls.__dataclass_fields__ if f != "path"}
        if unknown:
            raise PromptConfigError(f"{p}: unknown keys {sorted(unknown)}")
        for i, ex in enumerate(raw.get("examples") or []):
            if not isinstance(ex, dict) or set(ex) != {"input", "plan"}:
                raise PromptConfigError(f"{p}: examples[{i}] must have exactly 'input' and 'plan'")
        raw["guidance"] = list(raw.get("guidance") or [])
        raw["examples"] = list(raw.get("examples") or [])
        return cls(**raw, path=p)


class PromptBuilder:
    """Renders task prompts for one robot type with a given tokenizer."""

    def __init__(self, tokenizer: Any, robot_type: str | Path, skillset: SkillSet | None = None,
                 check_examples: bool = True) -> None:
        self.tokenizer = tokenizer
        self.config = PromptConfig.load(robot_type)
        self.skillset = skillset or load_skill_set(self.config.skill_set)
        if check_examples and self.skillset.grammar != "text":
            for ex in self.config.examples:  # a bad example teaches the model a bad plan
                err = self.skillset.validate(ex["plan"], complete=True)
                if err:
                    raise PromptConfigError(f"{self.config.path}: example plan {ex['plan']!r} does not parse: {err}")
        self._prefix_cache: list[int] | None = None

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

    def messages(self, task_input: str, scene: str | None = None) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system_text()}]
        for ex in self.config.examples:
            msgs.append({"role": "user", "content": self.user_text(ex["input"])})
            msgs.append({"role": "assistant", "content": ex["plan"]})
        msgs.append({"role": "user", "content": self.user_text(task_input, scene)})
        return msgs

    def render(self, task_input: str, scene: str | None = None, plan_so_far: str = "") -> str:
        """Prompt text; ``plan_so_far`` becomes the start of the assistant's answer."""
        text = self.tokenizer.apply_chat_template(self.messages(task_input, scene), tokenize=False,
                                                  add_generation_prompt=True)
        return text + plan_so_far

    def token_ids(self, task_input: str, scene: str | None = None) -> list[int]:
        """Prompt token ids (the plan so far, if any, is appended by the engine as token ids)."""
        text = self.render(task_input, scene)
        # The chat template already contains the special tokens; do not add a BOS again.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def regex(self, plan_so_far: str = "") -> str | None:
        """Constrained-decoding regex for the rest of the plan (None for prose)."""
        return grammar.continuation_regex(self.skillset, plan_so_far)
