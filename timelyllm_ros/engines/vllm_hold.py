"""Suspended generations whose vLLM request still stands: held in place out of vLLM's running list, or parked
where they were on an idle engine (the "In place" part of :mod:`timelyllm_ros.engines.vllm_engine`'s doc).

:class:`BatchHold` owns them and the rule of when one is held and when it is released; what it reaches into is vLLM
0.32's V1 scheduler (its ``running`` list and ``requests`` map, the request's status and token counts).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from timelyllm_ros.engines.base import EngineRequest

if TYPE_CHECKING:
    from timelyllm_ros.engines.vllm_engine import Submission, VllmEngine

# A suspended generation is held in place only while vLLM's KV cache is used below this fraction (module doc):
# a held request pins its blocks, and vLLM cannot preempt what is not in its running list.
HOLD_KV_USAGE = 0.9


class BatchHold:
    """The suspended generations of ``engine`` whose vLLM request still stands, in the order they were suspended:
    gen_id -> the vLLM Request taken out of the scheduler's running list (held), or None (parked where it was, on
    an idle engine). At most ``engine.max_batch`` held. ``cancel``: aborts a generation's vLLM request."""

    def __init__(self, engine: VllmEngine, cancel: Callable[[str], None]) -> None:
        self.engine, self.cancel = engine, cancel
        self.parked: OrderedDict[str, Any] = OrderedDict()

    def can_hold(self) -> Any | None:
        """vLLM's scheduler if a request can be taken out of its running list and put back (module doc): an
        in-process synchronous core (no async scheduling, no batch queue: nothing of the request in flight)."""
        eng = self.engine
        sched = eng.scheduler
        if sched is None or not eng.park_busy or eng.max_batch <= 0:
            return None
        if not isinstance(getattr(sched, "running", None), list) or not isinstance(getattr(sched, "requests", None),
                                                                                   dict):
            return None  # not the scheduler this was written against (module doc)
        # the engine's in-process core (InprocClient.engine_core): there is one, as there is a scheduler
        core = getattr(eng.llm_engine.engine_core, "engine_core", None)
        if getattr(core, "batch_queue", None) is not None:
            return None
        if getattr(eng.llm_engine.vllm_config.scheduler_config, "async_scheduling", False):
            return None
        return sched

    def kv_tight(self) -> bool:
        sched = self.engine.scheduler
        return sched is not None and float(sched.kv_cache_manager.usage) >= HOLD_KV_USAGE

    def held(self) -> int:
        return sum(1 for r in self.parked.values() if r is not None)

    def take_out_of_batch(self, sub: Submission) -> Any | None:
        """Hold a suspended generation's vLLM request in place: out of the running list, KV blocks kept. None
        if it cannot be held (no room, KV cache filling up, not in a state to be taken out)."""
        from vllm.v1.request import RequestStatus

        sched = self.can_hold()
        if sched is None:
            return None
        if len(self.engine.running_ids()) + self.held() + 1 > self.engine.max_batch or self.kv_tight():
            return None
        r = sched.requests.get(sub.int_id)
        if (r is None or r.status != RequestStatus.RUNNING or r.num_output_placeholders
                or r.num_computed_tokens + 1 != r.num_tokens):  # exactly its last sampled token not computed yet
            return None
        try:
            sched.running.remove(r)  # a list of at most max_num_seqs requests
        except ValueError:
            return None
        return r

    def make_room(self, kv: bool = False) -> int:
        """Release held generations (abort: resubmitted on resume) until ``live + held <= max_num_seqs`` and, with
        ``kv``, the KV cache is below HOLD_KV_USAGE; most recently suspended first. A generation parked on an idle
        engine is released by any other (it still sits in the running list). How many were released."""
        live = self.engine.running_ids()  # releasing one cancels its vLLM request only: the live ones stay
        released = 0
        for gen_id, r in reversed(list(self.parked.items())):
            if gen_id in live:
                continue
            if r is not None and len(live) + self.held() <= self.engine.max_batch and not (kv and self.kv_tight()):
                continue
            del self.parked[gen_id]
            released += 1
            self.cancel(gen_id)
        return released

    def unpark(self, req: EngineRequest, ahead: int = 0) -> bool:
        """Resume a held or parked generation in place; False if it must be (re)submitted. ``ahead``: tokens vLLM
        wrote past the boundary that are kept for the handover."""
        if req.gen_id not in self.parked:
            return False
        held = self.parked.pop(req.gen_id)
        sub = self.engine.submission(req.gen_id)
        # The same generation, and vLLM's request holds exactly the plan so far and the kept tokens.
        if sub is not None and sub.req is req and sub.prompt_len + sub.n_out == len(req.all_token_ids) + ahead:
            if held is None:
                return True
            sched = self.engine.scheduler
            if (sched is not None and sched.requests.get(sub.int_id) is held and not held.is_finished()
                    and len(sched.running) < self.engine.max_batch):
                sched.running.append(held)  # scheduled again in the next step, from its last sampled token
                return True
        self.cancel(req.gen_id)
        return False
