"""Finished tasks' results, kept for late readers (a retried goal, /get_plan_result) for a bounded time and
number; a forgotten task's id can be used again."""

from __future__ import annotations

from timelyllm_ros.domain.types import TaskResult


class ResultStore:
    """Results oldest first, at most ``keep_max`` and none older than ``keep_s``."""

    def __init__(self, keep_s: float, keep_max: int) -> None:
        self.keep_s, self.keep_max = keep_s, keep_max
        self._results: dict[str, TaskResult] = {}
        self._at: dict[str, float] = {}  # insertion order = finish order

    def add(self, res: TaskResult, now: float) -> list[tuple[str, TaskResult | None]]:
        """Keep ``res``; returns the (task id, result) pairs it pushed out."""
        self._results[res.task_id] = res
        self._at[res.task_id] = now
        horizon = now - self.keep_s
        out = []
        for tid in list(self._at):
            if len(self._at) <= self.keep_max and self._at[tid] > horizon:
                break
            del self._at[tid]
            out.append((tid, self._results.pop(tid, None)))
        return out

    def get(self, task_id: str) -> TaskResult | None:
        return self._results.get(task_id)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._results

    def __len__(self) -> int:
        return len(self._results)
