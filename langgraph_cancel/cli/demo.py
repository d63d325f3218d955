"""``demo``: the seed scenario, stop pressed mid-run by another thread, and its report.

The agent, its fake providers and where stop is pressed live in
:mod:`langgraph_cancel.demo`; this module runs them and prints what happens.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rich.status import Status
from rich.text import Text

from langgraph_cancel.cli import render
from langgraph_cancel.cli.config import PROG, Database, resolve_database
from langgraph_cancel.cli.database import open_saver
from langgraph_cancel.errors import CommandLineError

if TYPE_CHECKING:
    from langgraph_cancel.demo.scenario import Step, TruthCheck
    from langgraph_cancel.demo.services import Providers
    from langgraph_cancel.ledger import Ledger
    from langgraph_cancel.report import CancellationReport

#: Seconds the demo waits at the approval gate for its stop button.
APPROVAL_WAIT = 30.0
#: How often the stop button looks at the ledger, in seconds.
WATCH_INTERVAL = 0.02


class StopButton(threading.Thread):
    """Another thread watching the ledger as a user would, and pressing stop.

    Until the stop it prints each call's new status (after it, the run streams
    the steps of the stop itself); it asks the run to stop (through the ledger,
    as ``langgraph-cancel cancel`` from another process would) at the moment the
    step names.
    """

    def __init__(
        self,
        ledger: Ledger,
        threads: Sequence[str],
        step: Step,
        model_started: threading.Event,
        say: Callable[[Text], None],
        spinner: Status | None,
    ) -> None:
        super().__init__(name="langgraph-cancel-demo-stop", daemon=True)
        self.ledger = ledger
        #: The thread stop is pressed on, then any sub-agent's thread it watches too.
        self.threads = list(threads)
        self.thread_id = self.threads[0]
        self.step = step
        self.model_started = model_started
        self.say = say
        self.spinner = spinner
        #: Set by the main thread when the run is over: one last look, then stop.
        self.done = threading.Event()
        #: When stop was pressed (``time.monotonic()``), ``None`` until then.
        self.pressed_at: float | None = None
        #: What went wrong in this thread, re-raised by the main thread.
        self.error: BaseException | None = None
        self._seen: dict[str, str] = {}

    def run(self) -> None:
        """Watch until the run is over."""
        try:
            while not self.done.is_set():
                self._tick()
                self.done.wait(WATCH_INTERVAL)
            self._tick()
        except BaseException as exc:  # shown by the main thread
            self.error = exc

    def _tick(self) -> None:
        from langgraph_cancel.demo.scenario import trigger

        effects = []
        for thread in self.threads:
            try:
                effects.extend(self.ledger.effects(thread))
            except Exception:  # the run has not written its first row yet
                continue
        for effect in effects:
            if self._seen.get(effect.effect_id) != effect.status.value:
                self._seen[effect.effect_id] = effect.status.value
                # Once stop is pressed the run streams the stop's own steps.
                if self.pressed_at is None:
                    self.say(render.progress_line(effect))
        if self.pressed_at is not None or self.done.is_set():
            return
        hit = trigger(self.step, effects)
        if hit is None and not (self.step.name == "plan" and self.model_started.is_set()):
            return
        result = self.ledger.request_cancel(
            self.thread_id, reason="user pressed stop", requested_by="demo user"
        )
        self.pressed_at = time.monotonic()
        self.say(
            Text.assemble(("■ STOP pressed ", "bold red"), f"{self.step.when} ({result.message})")
        )
        if self.spinner is None:
            return
        if hit is not None and hit.status.value == "dispatched":
            self.spinner.update(
                f"stop requested; waiting for {render.call_label(hit.tool, hit.args)} to finish "
                "(the request has left the process: its outcome is awaited, never abandoned)…"
            )
        else:
            self.spinner.update("stop requested; draining the run…")


def _free_refund_keys(
    ledger: Ledger,
    saver: Any,
    db: Database,
    threads: list[str],
    step: Step,
    say: Callable[[Text], None],
) -> None:
    """Make the demo's refund keys available to ``thread``.

    A refund key is the ledger's, whatever the thread (``refund:o-88:40.00``:
    one refund per order and amount). On the command line's own default
    database another thread holding one is an earlier demo's, whose providers'
    world each demo resets: that thread is deleted. Anywhere else the demo
    refuses, rather than touch a thread it did not make.
    """
    from langgraph_cancel.demo.scenario import refund_keys

    for key in refund_keys(step):
        holder = ledger.effect_by_key(key)
        if holder is None or holder.thread_id in threads:
            continue
        if not db.builtin:
            raise CommandLineError(
                f"this database already holds the demo's refund key {key!r} on thread "
                f"{holder.thread_id!r}: run the demo with --thread {holder.thread_id} or "
                "another --db"
            )
        lease = ledger.lease(holder.thread_id)
        if lease is not None:
            ledger.release_lease(holder.thread_id, lease.owner)
        saver.delete_thread(holder.thread_id)
        say(Text(f"replaced the earlier demo on thread {holder.thread_id!r} (it held {key!r})"))


def _reset_world(
    ledger: Ledger, saver: Any, threads: Sequence[str], step: Step, providers_path: str, hang: float
) -> Providers:
    """Fresh providers (their fault armed for the step) and the demo's threads deleted."""
    from langgraph_cancel.demo import scenario, tools

    providers = scenario.reset_providers(providers_path)
    tools.set_providers_path(providers_path)
    scenario.arm(step, providers, hang)
    for each in threads:
        lease = ledger.lease(each)
        if lease is not None:
            ledger.release_lease(each, lease.owner)
        saver.delete_thread(each)
    return providers


def _demo_graph(step: Step, saver: Any, model_started: threading.Event) -> Any:
    """The refund agent the step runs (a parent and its sub-agent for ``subagent``)."""
    from langgraph_cancel.demo import graph as agent
    from langgraph_cancel.demo import scenario, subagent

    if step.in_child:
        refunds_agent = agent.build_builder(
            agent.scripted_model(subagent.child_script(step.refund_amount))
        ).compile(checkpointer=saver)
        return subagent.build_parent_builder(refunds_agent).compile(checkpointer=saver)
    model = scenario.demo_model(step, model_started)
    return agent.build_builder(
        model, compensate_on_cancel=step.compensate, limits=step.limits
    ).compile(checkpointer=saver)


def _say_chunk(mode: str, chunk: Any, say: Callable[[Text], None]) -> None:
    """The demo's lines for one streamed chunk (a node's update, or a step of the stop)."""
    from langgraph_cancel.progress import EVENT_KEY

    if mode == "updates" and isinstance(chunk, dict):
        for text in render.describe_update(chunk):
            say(text)
    elif mode == "custom" and isinstance(chunk, dict) and EVENT_KEY in chunk:
        described = render.describe_progress(chunk[EVENT_KEY])
        if described is not None:
            say(described)


def _await_stop(ledger: Ledger, run_id: str) -> None:
    """Wait, at the approval gate, for the stop button to press stop."""
    deadline = time.monotonic() + APPROVAL_WAIT
    while not ledger.get_run(run_id).cancel_requested:
        if time.monotonic() > deadline:
            raise CommandLineError("the demo paused for approval and stop was never pressed")
        time.sleep(WATCH_INTERVAL)


def _stream_to_end(graph: Any, ledger: Ledger, thread: str, say: Callable[[Text], None]) -> None:
    """Run the agent until its run ends, resuming it once stop is pressed at the gate."""
    from langgraph_cancel.demo import graph as agent

    config: Any = {"configurable": {"thread_id": thread}}
    inputs: Any = agent.seed_input()
    while True:
        for mode, chunk in graph.stream(inputs, config, stream_mode=["updates", "custom"]):
            _say_chunk(mode, chunk, say)
        latest = ledger.require_latest_run(thread)
        if latest.terminal or not graph.get_state(config).interrupts:
            return
        # Paused at the approval gate. Nobody approves in the demo: wait for the
        # stop, then resume the thread so the cancel finishes (pending calls dropped).
        say(
            Text.assemble(
                ("approval gate", "bold yellow"), ": the run is paused for a human decision"
            )
        )
        _await_stop(ledger, latest.run_id)
        say(Text("resuming the paused thread to finish the cancel"))
        inputs = None


def _run_with_stop_button(
    graph: Any,
    ledger: Ledger,
    db: Database,
    threads: Sequence[str],
    step: Step,
    model_started: threading.Event,
    say: Callable[[Text], None],
    spinner: Status | None,
) -> None:
    """Run the agent while the stop button watches the ledger from another thread."""
    from langgraph_cancel.ledger import Ledger

    # The stop button reads through a ledger of its own, as another process would.
    watch_ledger = ledger if db.url.is_memory else Ledger.from_url(db.url.url)
    button = StopButton(watch_ledger, threads, step, model_started, say, spinner)
    try:
        if spinner is not None:
            spinner.start()
        button.start()
        _stream_to_end(graph, ledger, threads[0], say)
    finally:
        button.done.set()
        button.join(timeout=10)
        if spinner is not None:
            spinner.stop()
        if watch_ledger is not ledger:
            watch_ledger.close()
    if button.error is not None:
        raise CommandLineError(f"the stop button failed: {button.error}")


def _print_outcome(
    report: CancellationReport, check: TruthCheck, thread: str, db: Database, providers_path: str
) -> None:
    """The report for people, whether the providers agree, and where to look next."""
    out = render.console()
    out.print()
    render.render_report(out, report)
    render.line(out, (check.line, "green" if check.agrees else "bold red"))
    render.line(
        out,
        f"Inspect it: `{PROG} status {thread}{db.flag}`, `{PROG} effects {thread} --history"
        f"{db.flag}`, `python -m langgraph_cancel.demo.services truth --db {providers_path}`",
    )


def run(args: argparse.Namespace) -> int:
    """``langgraph-cancel demo``: exit 1 when the report disagrees with the providers."""
    from langgraph_cancel.api import get_report
    from langgraph_cancel.demo import scenario, subagent, tools

    db = resolve_database(args.db)
    step = scenario.STEPS[args.cancel_at]
    thread = args.thread
    # The sub-agent scenario's child runs on a thread of its own: reset and watched too.
    threads = [thread, subagent.child_thread(thread)] if step.in_child else [thread]
    quiet = args.json
    err = render.console(stderr=True)
    providers_path = os.path.abspath(args.providers_db)

    def say(text: Text) -> None:
        if not quiet:
            render.line(err, text, hang=6)

    with open_saver(db, create=True) as saver:
        ledger: Ledger = saver.ledger
        # Refused before anything is reset: the database and the providers' file stay
        # as they were.
        _free_refund_keys(ledger, saver, db, threads, step, say)
        say(
            Text.assemble(
                ("langgraph-cancel demo", "bold"),
                f": the seed scenario on thread {thread!r}, stop pressed {step.when} "
                f"({args.cancel_at})",
            )
        )
        say(Text(f"  agent database: {db.url.redacted}; providers' truth: {providers_path}"))
        providers = _reset_world(ledger, saver, threads, step, providers_path, args.hang)
        model_started = threading.Event()
        graph = _demo_graph(step, saver, model_started)
        spinner = (
            None
            if quiet or not err.is_terminal
            else Status("running the refund agent…", console=err)
        )
        _run_with_stop_button(graph, ledger, db, threads, step, model_started, say, spinner)
        report = get_report(ledger, thread)
    check = scenario.check_truth(report, providers.truth(), tools.send_at_mail().truth())
    if quiet:
        print(report.model_dump_json(indent=2))
    else:
        _print_outcome(report, check, thread, db, providers_path)
    return 0 if check.agrees else 1


__all__ = ["APPROVAL_WAIT", "StopButton", "run"]
