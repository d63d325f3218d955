"""Chaos runner: plays a plan on a real graph until the thread rests, then checks it.

:class:`Runner` plays a plan on a real compiled graph (``add_cancellation``,
``ApprovalGate``, ``EffectToolNode``) on a memory, SQLite or PostgreSQL saver,
resumes it after every crash, answers every interrupt (the reviewer's decisions
to approvals, an operator's to unknown outcomes), then sends a new message (the
thread resumed after the stop) and finally checks the invariants I1-I8 of
``docs/design.md`` (``chaos_invariants``).

Also here: :func:`kill_worker`, the body of a real process that runs a plan
until a tool call reaches its kill point and blocks there to be SIGKILLed
(``tests/test_chaos_properties.py`` forks it from a fork server).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.types import Command

from chaos_graph import build_graph, db_url_of, open_saver, scripted_model
from chaos_invariants import (
    check_cancelled_run_starts_nothing,
    check_invariants,
    check_persisted_state_answers,
    check_resume_reconciles_first,
)
from chaos_plans import Crash, Plan, edited_args
from chaos_world import World
from langgraph_cancel import EffectStatus, Ledger
from langgraph_cancel.errors import ThreadBusyError
from langgraph_cancel.types import EffectRecord

#: Upper bound of invocations per phase of a plan (interrupts and crashes included).
MAX_STEPS = 40


# ------------------------------------------------------------------------------ the runner
@dataclass
class Step:
    """What one invocation did."""

    interrupts: list[Any] = field(default_factory=list)
    cancelled_events: list[dict[str, Any]] = field(default_factory=list)
    crashed: str | None = None  # "crash" | "killed"


class Runner:
    """Plays a plan on a thread, resumes it after every crash, then checks I1-I8."""

    def __init__(
        self,
        plan: Plan,
        root: Path,
        saver: Any,
        *,
        url: str | None = None,
        thread_id: str | None = None,
        arm_faults: bool = True,
    ) -> None:
        self.plan = plan
        self.world = World(root, plan)
        if thread_id is not None:
            self.world.thread_id = thread_id
        self.world.target = saver
        self.saver = saver
        self.ledger: Ledger = saver.ledger
        self.url = url
        self.model = scripted_model(self.world)
        self.graph = build_graph(self.world, self.model, saver)
        self.cfg: dict[str, Any] = {"configurable": {"thread_id": self.world.thread_id}}
        # Every dispatch the ledger accepts, by the tick at which it was *attempted*: one
        # attempted after a stop request of ours had returned must have been refused (I1).
        # Timestamps cannot tell this (a request is stamped before it commits).
        self.dispatches: list[tuple[int, str]] = []
        transition = self.ledger.transition

        def logged_transition(effect_id: str, to: Any, *args: Any, **kwargs: Any) -> Any:
            tick = next(self.world.seq)
            rec = transition(effect_id, to, *args, **kwargs)
            if EffectStatus(to) is EffectStatus.DISPATCHED:
                self.dispatches.append((tick, effect_id))
            return rec

        transition_many = self.ledger.transition_many

        def logged_transition_many(requests: Any) -> Any:
            tick = next(self.world.seq)
            out = transition_many(requests)
            for req, rec in zip(requests, out, strict=True):
                if req.to is EffectStatus.DISPATCHED and isinstance(rec, EffectRecord):
                    self.dispatches.append((tick, req.effect_id))
            return out

        self.ledger.transition = logged_transition
        self.ledger.transition_many = logged_transition_many
        self.cancelled_events: list[dict[str, Any]] = []
        self.approvals = 0
        self.decision_index = 0
        self.i7_checks = 0
        self.i8_checks = 0
        self.final_statuses: set[str] = set()
        self.run_statuses: set[str] = set()
        if arm_faults:
            for operation, mode in plan.faults:
                self.world.providers.set_fault(operation, mode, times=1)

    @property
    def thread_id(self) -> str:
        return self.world.thread_id

    def begin(self, plan: Plan) -> None:
        """Take ``plan`` as the script of the thread's next user message.

        Its calls are numbered after every earlier plan's and its turns counted
        from the AI messages already in the history; its injections, reviewer
        answers and faults start afresh. The graph (concurrency, async, cancel
        options) stays the one this runner was built with.
        """
        world = self.world
        state = self.graph.get_state(self.cfg).values if self.saver is not None else {}
        world.call_base += self.plan.n_calls
        world.turn_base = sum(isinstance(m, AIMessage) for m in state.get("messages", []))
        world.plan = self.plan = plan
        world.fired = set()
        self.decision_index = 0
        self.approvals = 0
        for operation, mode in plan.faults:
            world.providers.set_fault(operation, mode, times=1)

    # ---- invoking
    def _consume(self, chunks: Any, step: Step) -> None:
        for mode, data in chunks:
            if mode == "updates" and isinstance(data, dict) and "__interrupt__" in data:
                step.interrupts.extend(data["__interrupt__"])
            elif mode == "custom" and isinstance(data, dict):
                event = data.get("langgraph_cancel")
                if isinstance(event, dict) and event.get("event") == "cancelled":
                    step.cancelled_events.append(event)

    def invoke(self, inp: Any, *, worker: str | None = None) -> Step:
        step = Step()
        modes = ["updates", "custom"]
        cfg = self.cfg
        if worker is not None:
            cfg = {"configurable": {**self.cfg["configurable"], "langgraph_cancel_worker": worker}}
        if not self.plan.use_async:
            try:
                self._consume(self.graph.stream(inp, cfg, stream_mode=modes), step)
            except Crash:
                step.crashed = "crash"
        else:

            async def consume() -> None:
                async for chunk in self.graph.astream(inp, cfg, stream_mode=modes):
                    self._consume([chunk], step)

            async def main() -> None:
                self.world.loop = asyncio.get_running_loop()
                task = asyncio.ensure_future(consume())
                self.world.task = task
                try:
                    await task
                except asyncio.CancelledError:
                    if not task.cancelled():
                        raise
                    step.crashed = "killed"
                except Crash:
                    step.crashed = "crash"
                finally:
                    self.world.task = None

            asyncio.run(main())
        self.cancelled_events.extend(step.cancelled_events)
        return step

    def racing_resumes(self) -> None:
        """Two workers resume the crashed thread at once: one gets it, the other is told
        the thread is busy (I2: not dispatched twice by two workers)."""
        outcomes: list[Any] = []
        barrier = threading.Barrier(2)

        def resume(worker: str) -> None:
            try:
                barrier.wait(30)
                outcomes.append(self.invoke(None, worker=worker))
            except ThreadBusyError as exc:
                outcomes.append(exc)
            except BaseException as exc:  # handed back to the caller's thread
                outcomes.append(exc)

        threads = [
            threading.Thread(target=resume, args=(f"chaos-worker-{w}",), name="chaos-resume")
            for w in "ab"
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert len(outcomes) == 2, "a racing resume did not return"
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, ThreadBusyError):
                raise outcome
        self.world.notes.append("racing resumes: " + ", ".join(type(o).__name__ for o in outcomes))

    def invoke_retrying_lease(self, inp: Any, timeout: float = 40.0) -> Step:
        """Invoke; while a killed worker's lease is live, wait for it to lapse."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.invoke(inp)
            except ThreadBusyError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    # ---- answering
    def _next_decision(self) -> str:
        decisions = self.plan.decisions
        decision = (
            decisions[self.decision_index] if self.decision_index < len(decisions) else "approve"
        )
        self.decision_index += 1
        return decision

    def approval_answer(self, value: dict[str, Any]) -> dict[str, Any]:
        """The scripted reviewer's answer to the gate's question about a batch, or to the
        tool node's own question about one call (a call the gate did not ask about: its
        key was held by another call of the batch, then freed when that one was
        rejected or dropped)."""
        if value.get("type") == "tool_approval":
            (decision,) = self.approval_answer({"action_requests": [value]})["decisions"]
            return {**decision, "reviewer": "chaos-reviewer"}
        out: list[dict[str, Any]] = []
        for action in value["action_requests"]:
            kind = self._next_decision()
            if kind == "reject":
                out.append({"type": "reject", "message": "not this one"})
            elif kind in ("edit", "edit_invalid"):
                args = edited_args(action["name"], action["args"], valid=kind == "edit")
                out.append(
                    {"type": "edit", "edited_action": {"name": action["name"], "args": args}}
                )
            else:
                out.append({"type": "approve"})
        return {"decisions": out, "reviewer": "chaos-reviewer"}

    def operator_answer(self, value: dict[str, Any]) -> dict[str, Any]:
        """An operator settles unknown outcomes by asking the provider by key."""
        keys = self.world.providers.truth()["keys"]
        decisions = []
        for unknown in value["effects"]:
            applied = keys.get(unknown["idempotency_key"], {}).get("executions", 0) >= 1
            decisions.append(
                {
                    "effect_id": unknown["effect_id"],
                    "decision": "committed" if applied else "not_applied",
                    "result": "confirmed with the provider" if applied else None,
                    "reviewer": "chaos-operator",
                }
            )
        return {"decisions": decisions}

    # ---- driving
    def drive(self, inp: Any) -> None:
        """Invoke until the thread rests: every interrupt answered, every crash resumed."""
        for _ in range(MAX_STEPS):
            step = self.invoke_retrying_lease(inp)
            if step.crashed:
                check_persisted_state_answers(self)  # I7, before anything resumes
                run = self.ledger.latest_run(self.thread_id)
                if step.crashed == "killed" or (run is not None and run.terminal):
                    return
                if self.plan.racing_resumes and not self.plan.use_async:
                    self.racing_resumes()  # then carry on from wherever the winner stopped
                inp = None  # resume the crashed run from its last checkpoint
                continue
            if not step.interrupts:
                return
            value = step.interrupts[0].value
            if isinstance(value, dict) and value.get("type") == "langgraph_cancel.reconcile":
                inp = Command(resume=self.operator_answer(value))
                continue
            index = self.approvals
            self.approvals += 1
            resume: Any = Command(resume=self.approval_answer(value))
            for inj in self.world.approval_injections(index):
                self.world.cancel_from_another_thread(f"chaos cancel at approval {index}")
                if inj.phase == "none":
                    resume = None
            inp = resume
        raise AssertionError(f"the thread did not come to rest in {MAX_STEPS} invocations")

    def play(self) -> None:
        """The whole plan: run, resume after the stop, check I1-I8."""
        for _inj in self.world.start_injections():
            # The run exists (a server created it) and is stopped before any node runs.
            self.ledger.start_run(self.thread_id)
            self.world.cancel_from_another_thread("chaos cancel before the start")
        self.drive({"messages": [HumanMessage("go")]})
        check_cancelled_run_starts_nothing(self)  # I8, first half
        unsettled_before = [
            e
            for e in self.ledger.effects(self.thread_id)
            if e.status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN)
        ]
        runs_before = {r.run_id for r in self.ledger.runs(self.thread_id)}
        self.drive({"messages": [HumanMessage("where do things stand?")]})
        check_resume_reconciles_first(self, unsettled_before, runs_before)  # I8, second half
        check_invariants(self)
        self.final_statuses = {e.status.value for e in self.ledger.effects(self.thread_id)}
        self.run_statuses = {r.status.value for r in self.ledger.runs(self.thread_id)}


# ------------------------------------------------------------------------------ SIGKILL
def kill_worker(plan: Plan, root: str, thread_id: str, kill_point: tuple[int, str]) -> None:
    """Run ``plan``'s first invocation in this process until the kill point, and block there.

    Approvals are answered as the plan says. The lease TTL is short so the
    process that recovers the thread can take it over quickly.
    """
    import langgraph_cancel.lifecycle as lgc_lifecycle

    lgc_lifecycle.LEASE_TTL = 1.0
    rootp = Path(root)
    with open_saver("sqlite", rootp) as saver:
        runner = Runner(plan, rootp, saver, url=db_url_of("sqlite", rootp), thread_id=thread_id)
        runner.world.kill_point = kill_point
        runner.world.kill_marker = rootp / "killed-here"
        runner.drive({"messages": [HumanMessage("go")]})
    (rootp / "finished").write_text("the kill point was never reached")
    os._exit(0)
