"""Kill points of the kill -9 suite: named places in a job's run where its process
blocks until the test kills it, waits for the test's word, or marks that it passed.

``install_points`` wraps, in the job's process only, the ledger's writes (points
``before:<status>:<tool>`` / ``after:<status>:<tool>``, ``before:finish_run:<status>`` /
``after:finish_run:<status>``) and the fake providers' requests (``before_call:<operation>``
/ ``after_call:<operation>``); ``Points`` decides, at each, what the job does.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

from langgraph_cancel import Ledger
from langgraph_cancel.demo.providers.store import ProviderStore
from langgraph_cancel.types import effect_status


def say(what: str) -> None:
    """A timestamped line in the job's log."""
    now = time.time()
    print(
        f"{time.strftime('%H:%M:%S', time.localtime(now))}.{int(now * 1000) % 1000:03d} {what}",
        flush=True,
    )


class Points:
    """Named places in the run where a job may block (kill) or wait for the test (pause)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.dir = Path(spec["workdir"])
        self.job = spec["name"]
        self.kill_at: str | None = spec.get("kill_at")
        self.signal_at: set[str] = set(spec.get("signal_at") or ())
        self.pause_at: set[str] = set(spec.get("pause_at") or ())
        self.hold: dict[str, float] = dict(spec.get("hold") or {})
        self.seen: set[str] = set()
        self.trail: list[str] = []

    @staticmethod
    def file_name(job: str, point: str, suffix: str) -> str:
        """The marker file of a point (``:`` is kept out of file names)."""
        return f"{job}.{point.replace(':', '~')}.{suffix}"

    def _touch(self, point: str, suffix: str) -> None:
        path = self.dir / self.file_name(self.job, point, suffix)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(os.getpid()))
        tmp.replace(path)

    def hit(self, point: str) -> None:
        """Reach ``point``: the first time, block, pause or hold there as the job says."""
        self.trail.append(point)
        say(f"point {point}")
        if point in self.seen:
            return
        self.seen.add(point)
        if point in self.signal_at:
            self._touch(point, "reached")  # and carry on: the test kills us further on
        if point in self.hold:
            time.sleep(self.hold[point])
        if point in self.pause_at:
            self._touch(point, "paused")
            go = self.dir / self.file_name(self.job, point, "go")
            deadline = time.monotonic() + 60
            while not go.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no go for pause point {point}")
                time.sleep(0.01)
        if point == self.kill_at:
            self._touch(point, "reached")
            time.sleep(120)  # the test SIGKILLs us here
            os._exit(97)  # never killed: the test has failed already


def install_points(points: Points) -> None:
    """Wrap the ledger and the providers (in this process only) so they report points."""
    transition = Ledger.transition
    transition_many = Ledger.transition_many
    finish_run = Ledger.finish_run
    plan_many_and_begin = Ledger.plan_many_and_begin
    mutate = ProviderStore.mutate

    @functools.wraps(transition)
    def traced_transition(self: Ledger, effect_id: str, to: Any, **kwargs: Any) -> Any:
        name = effect_status(to).value
        tool_name = self.get_effect(effect_id).tool
        points.hit(f"before:{name}:{tool_name}")
        result = transition(self, effect_id, to, **kwargs)
        points.hit(f"after:{name}:{tool_name}")
        return result

    @functools.wraps(transition_many)
    def traced_transition_many(self: Ledger, requests: Any) -> Any:
        # One write for several moves (an outcome with the next intent): every "before"
        # point is the moment before the write, every "after" point the moment after.
        names = [(req.to.value, self.get_effect(req.effect_id).tool) for req in requests]
        for name, tool_name in names:
            points.hit(f"before:{name}:{tool_name}")
        result = transition_many(self, requests)
        for name, tool_name in names:
            points.hit(f"after:{name}:{tool_name}")
        return result

    @functools.wraps(plan_many_and_begin)
    def traced_plan_many_and_begin(self: Ledger, **kwargs: Any) -> Any:
        # A batch's plan carrying the intents of the calls to go first: "before" each
        # intent is the moment before the write; "after" it, the moment after, when
        # it was written.
        begin = set(kwargs["begin"])
        tools = [i.tool for i in kwargs["items"] if i.tool_call_id in begin]
        for tool_name in tools:
            points.hit(f"before:dispatched:{tool_name}")
        result = plan_many_and_begin(self, **kwargs)
        for rec in result[1]:
            points.hit(f"after:dispatched:{rec.tool}")
        return result

    @functools.wraps(finish_run)
    def traced_finish_run(self: Ledger, run_id: str, status: Any, **kwargs: Any) -> Any:
        name = getattr(status, "value", status)
        points.hit(f"before:finish_run:{name}")
        won = finish_run(self, run_id, status, **kwargs)
        points.hit(f"after:finish_run:{name}")
        return won

    @functools.wraps(mutate)
    def traced_mutate(self: ProviderStore, operation: str, key: str, *args: Any) -> Any:
        points.hit(f"before_call:{operation}")
        result = mutate(self, operation, key, *args)
        points.hit(f"after_call:{operation}")
        return result

    Ledger.transition = traced_transition  # type: ignore[method-assign,assignment]
    Ledger.transition_many = traced_transition_many  # type: ignore[method-assign,assignment]
    Ledger.finish_run = traced_finish_run  # type: ignore[method-assign,assignment]
    Ledger.plan_many_and_begin = traced_plan_many_and_begin  # type: ignore[method-assign,assignment]
    ProviderStore.mutate = traced_mutate  # type: ignore[method-assign,assignment]


__all__ = ["Points", "install_points", "say"]
