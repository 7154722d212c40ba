"""The vLLM requests a :class:`~timelyllm_ros.engines.vllm_engine.VllmEngine` stands per generation: one
:class:`Submission` per (re)submission, found by gen_id or by vLLM's request id, and the request ids each
generation ever used (bounded), for checks that vLLM holds nothing of an ended one.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

from timelyllm_ros.engines.base import EngineRequest
from timelyllm_ros.engines.detok import IncrementalDetokenizer

# Bounds on bookkeeping that would otherwise grow with every request of a long-running node
# (VllmEngine.submissions is a SubmissionLog: its last SUBMISSION_LOG_LEN records).
HISTORY_LEN = 4096  # generations (live or suspended) whose vLLM request ids are remembered
RETIRED_LEN = 256  # ended generations still remembered (backend_has_request checks after an abort)


@dataclass
class Submission:
    """One vLLM request = one (re)submission of a generation."""

    gen_id: str
    ext_id: str
    int_id: str
    prompt_len: int
    detok: IncrementalDetokenizer
    submitted: float
    max_tokens: int = 0  # what vLLM may generate in this submission
    n_out: int = 0  # tokens it generated so far
    first_output: float | None = None
    cached: int | None = None
    t_first: list[float] = field(default_factory=list)
    req: EngineRequest | None = None  # the generation's request object (a parked one resumes only for it)
    # An in-place resume continues vLLM's random draws, a resubmission reseeds (EngineRequest.sampling_seed):
    # a seeded sampled generation always resubmits, so its plan does not depend on the engine's load.
    parkable: bool = True


class RequestBook:
    """Per generation, the vLLM request standing for it now, and the request ids it ever used."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self.subs: dict[str, Submission] = {}  # gen_id -> current submission
        self.by_ext: dict[str, Submission] = {}  # vLLM external request id -> submission
        # gen_id -> vLLM internal ids it ever used (for checks), live and suspended generations (LRU);
        # an ended one moves to retired. Both bounded.
        self.history: OrderedDict[str, list[str]] = OrderedDict()
        self.retired: OrderedDict[str, list[str]] = OrderedDict()

    def new_ext_id(self, gen_id: str) -> str:
        """The external request id of the next submission of ``gen_id`` (unique in this engine)."""
        return f"{gen_id}#{next(self._seq)}"

    def add(self, sub: Submission) -> None:
        """``sub`` now stands for its generation (its vLLM request was added)."""
        self.subs[sub.gen_id] = sub
        self.by_ext[sub.ext_id] = sub

    def used(self, gen_id: str, int_id: str) -> None:
        """``gen_id`` uses vLLM's request ``int_id`` (an ended gen_id used again is live again)."""
        revived = self.retired.pop(gen_id, None) or []
        self.history.setdefault(gen_id, revived).append(int_id)
        self.history.move_to_end(gen_id)
        while len(self.history) > HISTORY_LEN:  # suspended and never resumed nor aborted
            self.history.popitem(last=False)

    def of_output(self, request_id: str) -> Submission | None:
        """The submission vLLM's output for ``request_id`` belongs to; None if it was cut or aborted since."""
        sub = self.by_ext.get(request_id)
        if sub is None or self.subs.get(sub.gen_id) is not sub:
            return None
        return sub

    def drop(self, sub: Submission) -> None:
        self.by_ext.pop(sub.ext_id, None)
        if self.subs.get(sub.gen_id) is sub:
            del self.subs[sub.gen_id]

    def retire(self, gen_id: str) -> None:
        """The generation ended: its request-id history moves to the bounded retired set."""
        ids = self.history.pop(gen_id, None)
        if ids is not None:
            self.retired[gen_id] = ids
            while len(self.retired) > RETIRED_LEN:
                self.retired.popitem(last=False)

    def ever(self, gen_id: str) -> set[str]:
        """vLLM's request ids ``gen_id`` used, while it is remembered."""
        return set(self.history.get(gen_id) or self.retired.get(gen_id) or ())
