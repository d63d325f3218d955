"""Chaos invariants: the checks I1-I8 of ``docs/design.md`` against the providers' truth.

Each check reads what a :class:`~chaos_runner.Runner` left behind (the ledger,
the checkpoint, the run reports) and holds it against what the providers
recorded (every request and every application per idempotency key): after a
crash, from the persisted state alone (I7); when a cancelled run is continued
(I8, I5) and when a stopped thread is resumed (I8); at rest after the whole
plan (I1-I6); and every call in exactly one bucket of its run's report.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage

from chaos_graph import dangling_calls
from chaos_plans import IRREVERSIBLE_OPS, RELEASED, REVERSIBLE_OPS, UNDO_PREFIX
from langgraph_cancel import EffectKind, EffectStatus, Ledger, get_report
from langgraph_cancel.effects import spec_of
from langgraph_cancel.types import (
    UNDISPATCHED_STATUSES,
    UNSETTLED_STATUSES,
    EffectRecord,
    RunRecord,
    RunStatus,
)

if TYPE_CHECKING:
    from chaos_runner import Runner


def _keys(runner: Runner) -> dict[str, dict[str, Any]]:
    keys: dict[str, dict[str, Any]] = runner.world.providers.truth()["keys"]
    return keys


def _applied(keys: dict[str, dict[str, Any]], ops: frozenset[str]) -> set[str]:
    return {k for k, v in keys.items() if v["operation"] in ops and v["executions"] >= 1}


def _fmt(effects: list[EffectRecord]) -> str:
    return "; ".join(
        f"{e.tool_call_id}:{e.tool}:{e.status.value}:{e.idempotency_key}" for e in effects
    )


def _task_tree(ledger: Ledger, run: RunRecord) -> list[RunRecord]:
    """``run`` and its sub-agents' runs, recursively."""
    tree, pending, seen = [], [run], set()
    while pending:
        here = pending.pop(0)
        if here.run_id in seen:
            continue
        seen.add(here.run_id)
        tree.append(here)
        pending.extend(ledger.child_runs(here.run_id))
    return tree


def check_buckets_add_up(runner: Runner) -> None:
    """Every call asked for is in exactly one bucket of its run's report.

    For each run of the thread, the report's buckets hold each call of the run
    and of its sub-agents' runs (recursively) exactly once, and nothing else;
    across the thread's runs, every call the model asked for (each tool call of
    each ``AIMessage`` in the thread's state) is accounted for.
    """
    ledger = runner.ledger
    thread = runner.thread_id
    accounted: Counter[str] = Counter()
    for run in ledger.runs(thread):
        report = get_report(runner.saver, thread, run_id=run.run_id)
        entries = [entry.effect_id for entry in report.entries()]
        calls = sorted(
            e.effect_id for r in _task_tree(ledger, run) for e in ledger.run_effects(r.run_id)
        )
        assert sorted(entries) == calls, (
            f"run {run.run_id} ({run.status.value}): its report's buckets hold {sorted(entries)}, "
            f"its task tree's calls are {calls}"
        )
        accounted.update(e.effect_id for e in ledger.run_effects(run.run_id))
    twice = sorted(effect_id for effect_id, n in accounted.items() if n > 1)
    assert not twice, f"calls in two runs' reports: {twice}"
    recorded = [e.tool_call_id for e in ledger.effects(thread)]
    messages = runner.graph.get_state(runner.cfg).values.get("messages", [])
    asked = [
        call["id"]
        for message in messages
        if isinstance(message, AIMessage)
        for call in message.tool_calls
        if call.get("id")
    ]
    # A call whose key an edit changed is recorded under ``<tool_call_id>~<digest>``.
    missing = [
        call_id
        for call_id in asked
        if not any(rec == call_id or rec.startswith(f"{call_id}~") for rec in recorded)
    ]
    assert not missing, f"calls the model asked for that no report accounts for: {missing}"


def check_persisted_state_answers(runner: Runner) -> None:
    """I7: after a crash, the ledger and the checkpoint alone say what was done and what next.

    Read through a fresh connection where the database allows it (another
    process would do exactly this).
    """
    runner.i7_checks += 1
    fresh: Ledger | None = None
    if runner.url is not None:
        fresh = Ledger.from_url(runner.url)
    ledger = fresh or runner.ledger
    try:
        effects = ledger.effects(runner.thread_id)
        run = ledger.latest_run(runner.thread_id)
    finally:
        if fresh is not None:
            fresh.close()
    keys = _keys(runner)
    by_key = {e.idempotency_key: e for e in effects}
    maybe = {
        EffectStatus.DISPATCHED,
        EffectStatus.COMMITTED,
        EffectStatus.UNKNOWN,
        EffectStatus.COMPENSATING,
        EffectStatus.COMPENSATED,
        EffectStatus.COMPENSATION_FAILED,
    }
    # What was (or may have been) committed: every key the world applied is known.
    for key in _applied(keys, IRREVERSIBLE_OPS | REVERSIBLE_OPS):
        rec = by_key.get(key)
        assert rec is not None, f"I7: the provider applied {key} but the ledger has no record"
        assert rec.status in maybe, f"I7: the provider applied {key}; the ledger says {rec}"
    # What was done: every committed side effect really happened.
    for record in effects:
        if record.kind is not EffectKind.READ_ONLY and record.status is EffectStatus.COMMITTED:
            assert keys.get(record.idempotency_key, {}).get("executions", 0) == 1, (
                f"I7: the ledger says {record.tool_call_id} committed, "
                "the provider never applied it"
            )
        if record.status is EffectStatus.DISPATCHED:
            assert record.owner, f"I7: {record.effect_id} is in flight with no owner"
        if record.status is EffectStatus.UNKNOWN:
            assert record.owner and record.next_action, (
                f"I7: {record.effect_id} unknown without owner/action"
            )
    # What the next step is: a live run resumes from its checkpoint's next node or
    # interrupt, or applies the saved writes of a step that finished but was not yet
    # committed (LangGraph lists no "next" for a task whose writes are saved). A
    # checkpoint at the very end (the failure hit a late checkpoint write) is a
    # finished agent turn with nothing in flight: resuming just closes the run.
    assert run is not None
    if not run.terminal:
        snapshot = runner.graph.get_state(runner.cfg)
        saved = runner.saver.get_tuple(runner.cfg)
        if not (snapshot.next or snapshot.interrupts or (saved and saved.pending_writes)):
            # A run whose cancel was asked for is finished by the next invoke of the
            # thread, whatever its checkpoint names: the graph had ended when the cancel
            # came, or a stopped task showed its stop under way in the thread state
            # (which leaves the calls it waited for unanswered), and the crash hit the
            # finish outside the graph (a compensation, say). The ledger says so (the
            # run's status), and that finish settles every effect the run left and
            # answers every call: it drops what never went out, reconciles what did
            # and compensates again what was being compensated. ``drive`` resumes it,
            # and the checks after the plan see that it did (I5 included).
            stopping = run.status in (RunStatus.CANCEL_REQUESTED, RunStatus.CANCELLING)
            messages = snapshot.values.get("messages", [])
            assert stopping or not dangling_calls(messages), (
                f"I7: run {run.run_id} is live, its checkpoint names no next step and leaves "
                f"calls unanswered: {dangling_calls(messages)}"
            )
            if not stopping:
                stuck = [
                    e for e in effects if e.status in UNSETTLED_STATUSES - {EffectStatus.UNKNOWN}
                ]
                assert not stuck, f"I7: nothing will settle {_fmt(stuck)}"


def _world_snapshot(runner: Runner) -> tuple[Any, ...]:
    keys = _keys(runner)
    return (
        {k: (v["attempts"], v["executions"]) for k, v in keys.items()},
        sum(runner.world.invocations.values()),
        runner.model.calls,
        [(e.effect_id, e.status) for e in runner.ledger.effects(runner.thread_id)],
    )


def check_cancelled_run_starts_nothing(runner: Runner) -> None:
    """I8 (first half) and I5: a cancelled run, continued, starts no new work."""
    run = runner.ledger.latest_run(runner.thread_id)
    if run is None or run.status is not RunStatus.CANCELLED:
        return
    runner.i8_checks += 1
    messages = runner.graph.get_state(runner.cfg).values.get("messages", [])
    assert dangling_calls(messages) == [], f"I5: dangling calls after cancel: {messages}"
    before = _world_snapshot(runner)
    step = runner.invoke(None)
    assert not step.crashed and not step.interrupts, step
    after = _world_snapshot(runner)
    assert after == before, f"I8: continuing a cancelled run did work: {before} -> {after}"
    assert runner.ledger.require_latest_run(runner.thread_id).run_id == run.run_id


def check_resume_reconciles_first(
    runner: Runner, unsettled_before: list[EffectRecord], runs_before: set[str]
) -> None:
    """I8 (second half): a resumed thread settles what it can before dispatching anything."""
    ledger = runner.ledger
    new_runs = [r for r in ledger.runs(runner.thread_id) if r.run_id not in runs_before]
    if not new_runs:
        return
    new_ids = {r.run_id for r in new_runs}
    first_dispatch = min(
        (
            t.at
            for e in ledger.effects(runner.thread_id)
            if e.run_id in new_ids
            for t in ledger.history(e.effect_id)
            if t.to_status is EffectStatus.DISPATCHED
        ),
        default=None,
    )
    if first_dispatch is None:
        return
    for old in unsettled_before:
        spec = spec_of(runner.graph.cancellation.tools[old.tool])
        if spec.reconcile is None:
            continue
        settled = [
            t
            for t in ledger.history(old.effect_id)
            if t.at >= old.updated_at
            and t.from_status in (EffectStatus.DISPATCHED, EffectStatus.UNKNOWN)
        ]
        assert settled, f"I8: {old.effect_id} ({old.status.value}) was not reconciled on resume"
        assert settled[0].at <= first_dispatch, (
            f"I8: the resumed thread dispatched at {first_dispatch} before reconciling "
            f"{old.effect_id} at {settled[0].at}"
        )


def check_invariants(runner: Runner) -> None:
    """I1-I6 against the providers' truth, at rest, after the whole plan."""
    ledger = runner.ledger
    thread = runner.thread_id
    effects = ledger.effects(thread)
    runs = ledger.runs(thread)
    keys = _keys(runner)
    by_key = {e.idempotency_key: e for e in effects}
    tools = runner.graph.cancellation.tools
    messages = runner.graph.get_state(runner.cfg).values.get("messages", [])
    context = f"\nnotes: {runner.world.notes}\neffects: {_fmt(effects)}\nkeys: {keys}"

    # ---- I4: one terminal transition per run; the first reason wins
    assert runs, "no run was recorded"
    for run in runs:
        assert run.terminal, f"I4: run {run.run_id} is left {run.status.value}{context}"
        assert ledger.finish_run(run.run_id, RunStatus.CANCELLED) is False
        assert ledger.finish_run(run.run_id, RunStatus.COMPLETED) is False
        if run.requested_at is not None:
            assert run.status is RunStatus.CANCELLED, (
                f"I4: run {run.run_id} was asked to stop but ended {run.status.value}{context}"
            )
        if run.status is RunStatus.CANCELLED:
            assert run.report is not None and run.report["status"] == "cancelled"
            events = [e for e in runner.cancelled_events if e["report"]["run_id"] == run.run_id]
            assert len(events) <= 1, f"I4: {len(events)} cancelled events for one run"
        firsts = [c for c in runner.world.cancels if c.run_id == run.run_id and c.first]
        ours = [c for c in runner.world.cancels if c.run_id == run.run_id and c.accepted]
        assert len(firsts) <= 1, f"I4: {len(firsts)} cancel requests were 'first'"
        if firsts:
            assert run.reason == firsts[0].reason, (run.reason, firsts[0].reason)
        # Every accepted request, first or not, was told the reason that won.
        assert all(c.reason == run.reason for c in ours), (run.reason, ours)
        if run.status is RunStatus.CANCELLED and run.report is not None:
            assert run.report["reason"] == run.reason
    # ---- I1: nothing dispatched after the signal
    run_of = {e.effect_id: e.run_id for e in effects}
    for mark, run_id in runner.world.cancel_marks:
        # Dispatches of other threads on the same ledger (a sub-agent's) are not this run's.
        late_ids = [
            eid for tick, eid in runner.dispatches if tick > mark and run_of.get(eid) == run_id
        ]
        assert not late_ids, (
            f"I1: dispatched after the stop request was committed: {late_ids}{context}"
        )
    for run in runs:
        report = get_report(runner.saver, thread, run_id=run.run_id)
        assert report.dispatched_after_cancel == 0, f"I1: {report}{context}"
        # The report accounts for every call of the run, each in exactly one bucket.
        accounted = [entry.effect_id for entry in report.entries()]
        asked = sorted(e.effect_id for e in effects if e.run_id == run.run_id)
        assert sorted(accounted) == asked, (
            f"report buckets {sorted(accounted)} != the run's calls {asked}{context}"
        )
        cutoff = run.observed_at or run.requested_at
        if cutoff is not None:
            late = [
                e
                for e in effects
                if e.run_id == run.run_id
                and e.dispatched_at is not None
                and e.dispatched_at > cutoff
            ]
            assert not late, f"I1: dispatched after the signal was observed: {_fmt(late)}{context}"
            # Nothing the run dropped ever reached a provider.
            dropped = [e for e in late if e.status is EffectStatus.DROPPED]
            assert not dropped, _fmt(dropped)
    # ---- I2: no key applied twice; no call repeated beyond its recorded dispatches
    for key, info in keys.items():
        assert info["executions"] <= 1, f"I2: key {key} applied {info['executions']} times"
        owner = key[len(UNDO_PREFIX) :] if key.startswith(UNDO_PREFIX) else key
        assert owner in by_key, f"I2/I7: the provider saw key {key} the ledger does not know"
    allowed_by_key: Counter[str] = Counter()
    holders: dict[str, list[str]] = defaultdict(list)
    for record in effects:
        trail = ledger.history(record.effect_id)
        fresh = sum(
            1
            for t in trail
            if t.to_status is EffectStatus.DISPATCHED
            and t.from_status is not EffectStatus.DISPATCHED
        )
        again = sum(
            1
            for t in trail
            if t.to_status is EffectStatus.DISPATCHED and t.from_status is EffectStatus.DISPATCHED
        )
        if record.kind is EffectKind.READ_ONLY and fresh == 0:
            continue  # fast reads are recorded after they ran; a re-run may read again
        spec = spec_of(tools[record.tool])
        if not spec.retry_safe:
            assert again == 0, (
                f"I2: {record.tool_call_id} ({record.tool}) re-dispatched in flight{context}"
            )
        # A fresh dispatch follows a plan/approval, or a reconcile that proved "not applied".
        per = spec.max_attempts if spec.retry_safe else 1
        # A key an effect gave up (``#released-to:``) ran under its plain name: its
        # dispatches count for the key with those of the effect that holds it now.
        key = record.idempotency_key.split(RELEASED, 1)[0]
        allowed_by_key[key] += (fresh + again) * per
        holders[key].append(f"{record.tool_call_id} ({record.tool}) {fresh}+{again}")
    for key, allowed in allowed_by_key.items():
        ran = runner.world.invocations.get(key, 0)
        reached = keys.get(key, {}).get("attempts", 0)
        assert ran <= allowed and reached <= allowed, (
            f"I2: key {key} ran {ran} times, reached the provider {reached} times, for "
            f"{allowed} allowed (dispatches x attempts) of {holders[key]}{context}"
        )
    # ---- I3: every dispatched effect is settled or unknown with owner and next action
    for record in effects:
        if record.status is EffectStatus.UNKNOWN:
            assert record.owner and record.next_action, f"I3: {record}"
        else:
            assert record.status not in UNSETTLED_STATUSES, (
                f"I3: {record.tool_call_id} left {record.status.value} at rest{context}"
            )
        if (
            record.dispatched_at is None
            and record.kind is not EffectKind.READ_ONLY
            and not allowed_by_key[record.idempotency_key]  # no earlier holder went out under it
        ):
            assert runner.world.invocations.get(record.idempotency_key, 0) == 0, (
                f"I1: {record.tool_call_id} ran without a dispatch record{context}"
            )
        if record.status in (EffectStatus.DROPPED, EffectStatus.REJECTED) or (
            record.status in UNDISPATCHED_STATUSES
        ):
            assert keys.get(record.idempotency_key, {}).get("executions", 0) == 0, (
                f"{record.tool_call_id} is {record.status.value} "
                f"but the provider applied it{context}"
            )
    # ---- I3/I7: "not applied" is never said of a call the world had applied
    applied_at = runner.world.applied_at()
    for record in effects:
        when = applied_at.get(record.idempotency_key)
        if when is None:
            continue
        for transition in ledger.history(record.effect_id):
            if transition.to_status in (EffectStatus.NOT_APPLIED, EffectStatus.FAILED):
                assert when > transition.at - timedelta(milliseconds=2), (
                    f"{record.tool_call_id} recorded {transition.to_status.value} "
                    f"at {transition.at} by {transition.actor}, "
                    f"but the provider had applied it at {when}{context}"
                )
    # ---- I5: every tool call in the history is answered
    assert dangling_calls(messages) == [], f"I5: {dangling_calls(messages)}{context}"
    # ---- I6: permanent == what the providers did (irreversible); reversible too
    applied_irr = _applied(keys, IRREVERSIBLE_OPS)
    permanent = {
        e.idempotency_key
        for e in effects
        if e.kind is EffectKind.IRREVERSIBLE and e.status is EffectStatus.COMMITTED
    }
    unknown = {e.idempotency_key for e in effects if e.status is EffectStatus.UNKNOWN}
    assert permanent <= applied_irr, (
        f"I6: reported permanent, never applied: {permanent - applied_irr}{context}"
    )
    assert applied_irr <= permanent | unknown, (
        f"I6: applied, neither permanent nor unknown: {applied_irr - permanent - unknown}{context}"
    )
    for run in runs:
        report = get_report(runner.saver, thread, run_id=run.run_id)
        reported = {e.idempotency_key for e in report.permanent}
        assert reported <= applied_irr, f"I6: run {run.run_id} reports {reported - applied_irr}"
        if run.status is RunStatus.CANCELLED:
            run_applied = {k for k in applied_irr if by_key[k].run_id == run.run_id}
            seen = reported | {e.idempotency_key for e in report.unknown}
            assert run_applied <= seen, (
                f"I6: the cancel report of {run.run_id} misses {run_applied - seen}{context}"
            )
    truth = runner.world.providers.truth()
    tickets = {t["key"]: t for t in truth["tickets"]}
    for record in effects:
        if record.kind is not EffectKind.REVERSIBLE:
            continue
        if record.status is EffectStatus.COMMITTED:
            assert (
                record.idempotency_key in tickets
                and tickets[record.idempotency_key]["status"] == "open"
            )
        elif record.status is EffectStatus.COMPENSATED:
            assert tickets[record.idempotency_key]["status"] == "closed"
        elif record.status in (EffectStatus.DROPPED, EffectStatus.REJECTED, EffectStatus.FAILED):
            assert record.idempotency_key not in tickets, (
                f"{record.tool_call_id} {record.status.value}{context}"
            )
