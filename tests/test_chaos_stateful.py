"""A Hypothesis state machine over one thread's life: many messages, chaos, operators.

``test_chaos_properties.py`` plays one plan per example on a fresh thread. Here
one thread lives through a sequence of steps Hypothesis chooses, so what one
step leaves behind is what the next one meets:

* a user message: one to three model turns of mixed effect kinds, with the
  reviewer's answers, provider faults and chaos (a stop request, a crash in a
  tool or a hook, the invocation's task killed), played on the same graph; a
  refund may name an earlier message's refund (the same declared key), so a
  refund the stop dropped, one a reviewer rejected and one already issued are
  all asked for again;
* a stop pressed between messages (on a finished run: a no-op; on a crashed
  run: the next invocation finishes the cancel);
* the thread continued with no input (a resume);
* an operator's ``reconcile`` and ``compensate`` from outside the graph;
* a message a parent run hands to a sub-agent on its own thread (``child_config``),
  on the same saver, the stop maybe pressed at the parent while one of the
  sub-agent's calls runs: every call the sub-agent's model asked for must be in
  exactly one bucket of the parent's report, marked with the child run, and the
  parent's permanent effects are the sub-agent's irreversible calls that ran;
* the thread brought to rest by a status message.

After every step the persisted state alone must answer I7 (what was done, what
was or may have been committed, what comes next) and no key may have reached a
provider twice (I2); at rest, every call asked for (of every run and of its
sub-agents' runs) is in exactly one bucket of its run's report; at rest, and at
the end, all of I1-I8 are checked against the providers' truth with the same
checks as the whole-plan property. The machine runs on memory and SQLite, and
on PostgreSQL in a test of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph

from chaos_harness import (
    IRREVERSIBLE_OPS,
    REVERSIBLE_OPS,
    CallSpec,
    Crash,
    Plan,
    Runner,
    check_buckets_add_up,
    check_cancelled_run_starts_nothing,
    check_invariants,
    check_persisted_state_answers,
    check_resume_reconciles_first,
    db_url_of,
    open_saver,
)
from chaos_strategies import chaos, decisions_strategy, faults_strategy, turns_strategy
from graphs import (
    ExecutionLog,
    agent_builder,
    calls,
    cancellable,
    config_for,
    counting_tool,
    scripted,
)
from hypothesis_profiles import examples
from langgraph_cancel import (
    EffectKind,
    EffectStatus,
    EffectToolNode,
    add_cancellation,
    get_report,
    request_cancel,
)
from langgraph_cancel.api import compensate
from langgraph_cancel.errors import UnknownThreadError
from langgraph_cancel.recovery import reconcile
from langgraph_cancel.subagents import child_config
from langgraph_cancel.types import UNSETTLED_STATUSES, EffectRecord, RunStatus

pytestmark = pytest.mark.version_neutral


class OneThread(RuleBasedStateMachine):
    """One thread on one saver, driven by the steps Hypothesis picks.

    Args:
        backends: The backends an example may run on.
        pg_url: The PostgreSQL database (examples share it, each on its own thread).
    """

    def __init__(
        self, backends: tuple[str, ...] = ("memory", "sqlite"), pg_url: str | None = None
    ) -> None:
        super().__init__()
        self.backends = backends
        self.pg_url = pg_url
        self._stack = contextlib.ExitStack()
        self.runner: Runner | None = None
        self.refs: list[str] = []  # every refund ref asked for so far
        self.messages = 0
        self.resting = True
        self.delegations = 0
        self.sub_agent_log: ExecutionLog | None = None

    # ------------------------------------------------------------------ set-up
    @initialize(
        data=st.data(),
        effect_concurrency=st.integers(1, 3),
        use_async=st.booleans(),
        compensate_on_cancel=st.booleans(),
        reconcile_interactive=st.booleans(),
    )
    def open_thread(
        self,
        data: st.DataObject,
        effect_concurrency: int,
        use_async: bool,
        compensate_on_cancel: bool,
        reconcile_interactive: bool,
    ) -> None:
        backend = data.draw(st.sampled_from(self.backends), label="backend")
        root = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-sm-")))
        self.sub_agent_log = ExecutionLog(root / "sub-agents.db")
        saver = self._stack.enter_context(open_saver(backend, root, self.pg_url))
        self.base = Plan(
            turns=(),
            effect_concurrency=effect_concurrency,
            backend=backend,
            use_async=use_async,
            compensate_on_cancel=compensate_on_cancel,
            reconcile_interactive=reconcile_interactive,
        )
        self.runner = Runner(self.base, root, saver, url=db_url_of(backend, root, self.pg_url))

    def teardown(self) -> None:
        try:
            if self.runner is not None and self.messages > 0:
                if not self.resting:
                    self.status_message()
                check_invariants(self.runner)
        finally:
            self._stack.close()

    # ------------------------------------------------------------------ helpers
    @property
    def current_runner(self) -> Runner:
        assert self.runner is not None
        return self.runner

    def _drive(self, inp: Any) -> None:
        """Drive the thread; a resumed thread must reconcile before it dispatches (I8)."""
        runner = self.current_runner
        unsettled: list[EffectRecord] = [
            e
            for e in runner.ledger.effects(runner.thread_id)
            if e.status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN)
        ]
        runs = {r.run_id for r in runner.ledger.runs(runner.thread_id)}
        runner.drive(inp)
        check_resume_reconciles_first(runner, unsettled, runs)

    def _at_rest(self) -> bool:
        runner = self.current_runner
        runs = runner.ledger.runs(runner.thread_id)
        effects = runner.ledger.effects(runner.thread_id)
        return all(r.terminal for r in runs) and not any(
            e.status in UNSETTLED_STATUSES - {EffectStatus.UNKNOWN} for e in effects
        )

    # ------------------------------------------------------------------ rules
    @rule(data=st.data())
    def user_message(self, data: st.DataObject) -> None:
        """A new message: its turns, the reviewer's answers, faults and chaos."""
        turns = data.draw(turns_strategy, label="turns")
        if self.refs:
            # Some refunds are asked for again, under an earlier message's ref.
            again = st.one_of(st.none(), st.sampled_from(self.refs))
            turns = tuple(
                tuple(
                    CallSpec(c.tool, c.variant, data.draw(again, label="ref"))
                    if c.tool == "cx_refund"
                    else c
                    for c in turn
                )
                for turn in turns
            )
        n_calls = sum(len(t) for t in turns)
        plan = dataclasses.replace(
            self.base,
            turns=turns,
            decisions=data.draw(decisions_strategy, label="decisions"),
            injections=data.draw(chaos(n_calls, len(turns), self.base.use_async), label="chaos"),
            faults=data.draw(faults_strategy, label="faults"),
            racing_cancels=data.draw(st.sampled_from((1, 1, 2)), label="racing cancels"),
            racing_resumes=data.draw(st.booleans(), label="racing resumes"),
        )
        runner = self.current_runner
        runner.begin(plan)
        earlier = set(self.refs)
        first = runner.world.call_base
        for call_number, spec in (p for turn in plan.numbered(first) for p in turn):
            if spec.tool == "cx_refund":
                self.refs.append(spec.ref or f"r-c{call_number}")
        self.messages += 1
        self._drive({"messages": [HumanMessage(f"message {self.messages}")]})
        check_cancelled_run_starts_nothing(runner)
        self.resting = self._at_rest()
        for inj in sorted(runner.world.fired, key=repr):
            event(f"fired: {inj.what} at {inj.where} {inj.phase}")
        if any(c.ref in earlier for t in turns for c in t):
            event("a refund asked for again")
        if not self.resting:
            event("a message left the thread unsettled")

    @rule()
    def status_message(self) -> None:
        """Bring the thread to rest (the user asks where things stand); then I1-I8."""
        self.current_runner.begin(self.base)  # no turns: the model answers at once
        self.messages += 1
        self._drive({"messages": [HumanMessage("where do things stand?")]})
        check_cancelled_run_starts_nothing(self.current_runner)
        check_invariants(self.current_runner)
        self.resting = True

    @rule(
        kinds=st.lists(st.sampled_from(tuple(EffectKind)), min_size=1, max_size=4),
        data=st.data(),
    )
    def message_delegated_to_a_sub_agent(
        self, kinds: list[EffectKind], data: st.DataObject
    ) -> None:
        """A parent run hands the work to a sub-agent on its own thread; stop maybe pressed.

        The stop, if any, is pressed at the parent while one of the sub-agent's calls
        is running. Every call the sub-agent's model asked for is then in exactly one
        bucket of the parent's report, marked with the child run; the parent's
        permanent effects are the sub-agent's irreversible calls that ran; what the
        stop dropped never ran.
        """
        stop_during = data.draw(
            st.one_of(st.none(), st.integers(0, len(kinds) - 1)), label="stop during call"
        )
        runner = self.current_runner
        log = self.sub_agent_log
        assert log is not None
        self.delegations += 1
        parent_thread = f"{runner.thread_id}-delegating-{self.delegations}"
        child_thread = f"{parent_thread}-sub-agent"
        names = [f"sub{self.delegations}_{index}" for index in range(len(kinds))]

        def stop(_item: str) -> None:
            request_cancel(runner.saver, parent_thread, reason="stop", requested_by="parent")

        tools = [
            counting_tool(log, name, kind, after=stop if index == stop_during else None)
            for index, (name, kind) in enumerate(zip(names, kinds, strict=True))
        ]
        asked = [f"{child_thread}-call-{index}" for index in range(len(kinds))]
        model = scripted(
            calls(*[(name, "x", call) for name, call in zip(names, asked, strict=True)])
        )
        child = cancellable(agent_builder(model, EffectToolNode(tools)), runner.saver)

        def delegate(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
            out = child.invoke(
                {"messages": [HumanMessage("do it")]}, child_config(config, child_thread)
            )
            return {"messages": [AIMessage(f"sub-agent: {out['messages'][-1].text}")]}

        builder = StateGraph(MessagesState)
        builder.add_node("delegate", delegate)
        builder.add_edge(START, "delegate")
        builder.add_edge("delegate", END)
        parent = add_cancellation(builder).compile(checkpointer=runner.saver)
        parent.invoke({"messages": [HumanMessage("delegate")]}, config_for(parent_thread))
        event(
            "a message delegated to a sub-agent"
            + (" and stopped" if stop_during is not None else "")
        )

        ledger = runner.ledger
        parent_run = ledger.latest_run(parent_thread)
        child_run = ledger.latest_run(child_thread)
        assert parent_run is not None and child_run is not None
        assert child_run.parent_run_id == parent_run.run_id
        report = get_report(runner.saver, parent_thread, run_id=parent_run.run_id)
        entries = report.entries()
        # Every call asked for, in exactly one bucket, each marked with the child run.
        assert sorted(entry.tool_call_id for entry in entries) == sorted(asked), report
        assert {entry.child_run_id for entry in entries} == {child_run.run_id}
        recorded = {e.effect_id for e in ledger.run_effects(child_run.run_id)}
        assert {entry.effect_id for entry in entries} == recorded
        # Permanent: the sub-agent's irreversible calls that really ran.
        ran = {call for name, call in zip(names, asked, strict=True) if log.applied(name)}
        irreversible = {
            call for kind, call in zip(kinds, asked, strict=True) if kind is EffectKind.IRREVERSIBLE
        }
        assert {entry.tool_call_id for entry in report.permanent} == ran & irreversible
        # What never ran is in "not run", and the other way round.
        attempted = {call for name, call in zip(names, asked, strict=True) if log.attempts(name)}
        assert {entry.tool_call_id for entry in report.not_run} == set(asked) - attempted
        if stop_during is None:
            assert parent_run.status is RunStatus.COMPLETED and attempted == set(asked)
        else:
            assert parent_run.status is RunStatus.CANCELLED, parent_run
            assert child_run.status is RunStatus.CANCELLED, child_run
            assert asked[stop_during] in ran
            assert report.orphans == 0 and report.dispatched_after_cancel == 0, report

    @rule(act=st.sampled_from(("stop", "continue", "reconcile", "compensate")))
    def between_messages(self, act: str) -> None:
        """Someone acts on the thread while no message is in progress."""
        event(f"between messages: {act}")
        {
            "stop": self.stop_between_messages,
            "continue": self.continue_without_input,
            "reconcile": self.operator_reconciles,
            "compensate": self.operator_compensates,
        }[act]()

    def stop_between_messages(self) -> None:
        """A stop pressed with no message in progress."""
        runner = self.current_runner
        if not self.messages:
            with pytest.raises(UnknownThreadError):  # a typed answer, nothing recorded
                request_cancel(runner.saver, runner.thread_id, reason="early", requested_by="t")
            return
        before = runner.ledger.latest_run(runner.thread_id)
        statuses = {r.run_id: r.status for r in runner.ledger.runs(runner.thread_id)}
        runner.world.cancel_from_another_thread("stop pressed between messages")
        answers = runner.world.cancels[-max(1, runner.plan.racing_cancels) :]
        if before is None or before.terminal:
            # Nothing to stop: a clear no-op, and no run changes.
            assert not any(a.accepted for a in answers), answers
            after = {r.run_id: r.status for r in runner.ledger.runs(runner.thread_id)}
            assert after == statuses
        else:
            # A run a crash left live: recorded now, finished by the next invocation.
            assert any(a.accepted for a in answers), answers
            self.resting = False

    def continue_without_input(self) -> None:
        """``invoke(None)``: resumes a crashed run; on a finished thread it does nothing."""
        runner = self.current_runner
        if not self.messages:
            return  # nothing to continue (tests/test_run_completion.py covers that call)
        run = runner.ledger.latest_run(runner.thread_id)
        if run is not None and run.terminal and self.resting:
            check_cancelled_run_starts_nothing(runner)
            before = len(runner.ledger.effects(runner.thread_id))
            step = runner.invoke(None)
            assert not step.crashed and not step.interrupts, step
            assert len(runner.ledger.effects(runner.thread_id)) == before
            return
        self._drive(None)
        self.resting = self._at_rest()

    def operator_reconciles(self) -> None:
        """``langgraph-cancel reconcile THREAD`` between invocations."""
        runner = self.current_runner
        if not self.messages:
            return
        (result,) = reconcile(runner.saver, runner.thread_id, tools=runner.graph.cancellation.tools)
        assert result.busy is None, f"no worker is live between steps, yet {result.busy} holds it"
        for rec in result.still_unknown:
            assert rec.owner and rec.next_action, rec
        keys = runner.world.providers.truth()["keys"]
        for settled in result.settled:
            record = settled.effect
            if record.status is EffectStatus.COMMITTED and record.kind is not EffectKind.READ_ONLY:
                assert keys.get(record.idempotency_key, {}).get("executions", 0) == 1, record
            if record.status is EffectStatus.NOT_APPLIED:
                assert keys.get(record.idempotency_key, {}).get("executions", 0) == 0, record
        self.resting = self._at_rest()

    def operator_compensates(self) -> None:
        """``langgraph-cancel compensate THREAD``: undo the committed reversible effects."""
        runner = self.current_runner
        if not self.messages:
            return
        try:
            done = compensate(runner.saver, runner.thread_id, tools=runner.graph.cancellation.tools)
        except Crash:
            # The operator's process died in a compensate hook (a crash the last message
            # armed and never reached). The database says what is next (the effect is
            # compensating) and the thread's next input finishes it.
            half = [
                e
                for e in runner.ledger.effects(runner.thread_id)
                if e.status is EffectStatus.COMPENSATING
            ]
            assert half, "a crash in a compensate hook left nothing compensating"
            self.resting = False
            return
        tickets = {t["key"]: t for t in runner.world.providers.truth()["tickets"]}
        for record in done:
            assert record.kind is EffectKind.REVERSIBLE, record
            assert record.status in (EffectStatus.COMPENSATED, EffectStatus.COMPENSATION_FAILED), (
                record
            )
            if record.status is EffectStatus.COMPENSATED:
                assert tickets[record.idempotency_key]["status"] == "closed", record
        left = [
            e
            for e in runner.ledger.effects(runner.thread_id)
            if e.kind is EffectKind.REVERSIBLE and e.status is EffectStatus.COMMITTED
        ]
        assert not left, f"committed reversible effects left uncompensated: {left}"

    # ------------------------------------------------------------------ invariants
    @invariant()
    def persisted_state_answers(self) -> None:
        """I7 after every step, from the database alone (a fresh connection)."""
        if self.runner is not None and self.messages > 0:
            check_persisted_state_answers(self.runner)

    @invariant()
    def every_call_in_exactly_one_bucket(self) -> None:
        """At rest: each call asked for, of every run and sub-agent, in one report bucket."""
        if self.runner is not None and self.messages > 0 and self.resting:
            check_buckets_add_up(self.runner)

    @invariant()
    def no_key_reached_a_provider_twice(self) -> None:
        """I2 after every step: each key applied at most once, by every provider."""
        if self.runner is None:
            return
        keys = self.runner.world.providers.truth()["keys"]
        twice = {
            k: v["executions"]
            for k, v in keys.items()
            if v["operation"] in IRREVERSIBLE_OPS | REVERSIBLE_OPS and v["executions"] > 1
        }
        assert not twice, f"I2: applied more than once: {twice}"


OneThread.TestCase.settings = settings(
    max_examples=examples(ci=30, dev=10),
    stateful_step_count=10,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_one_thread_through_messages_chaos_and_operators = pytest.mark.timeout(1500)(OneThread.TestCase)


@pytest.mark.timeout(1500)
def test_one_thread_on_postgres(pg_url: str) -> None:
    """The same machine on PostgreSQL (fewer examples: each opens its own pools)."""

    class OnPostgres(OneThread):
        def __init__(self) -> None:
            super().__init__(backends=("postgres",), pg_url=pg_url)

    run_state_machine_as_test(
        OnPostgres,
        settings=settings(
            max_examples=examples(ci=8, dev=3),
            stateful_step_count=8,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )
