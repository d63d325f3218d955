"""Hypothesis strategies of the chaos suites: tool calls, turns, reviewers, faults, chaos.

Shared by the whole-plan property (``test_chaos_properties.py``) and the
stateful machine (``test_chaos_stateful.py``).
"""

from __future__ import annotations

from hypothesis import strategies as st

from chaos_harness import TOOL_NAMES, CallSpec, Inject

call_specs = st.builds(
    CallSpec,
    tool=st.sampled_from(TOOL_NAMES),
    variant=st.sampled_from((0, 0, 1, 2)),
)
turns_strategy = st.lists(
    st.lists(call_specs, min_size=1, max_size=6).map(tuple), min_size=1, max_size=3
).map(tuple)
decisions_strategy = st.lists(
    st.sampled_from(("approve", "approve", "reject", "edit", "edit_invalid")), max_size=12
).map(tuple)
faults_strategy = st.lists(
    st.tuples(
        st.sampled_from(("send_email", "refund", "create_ticket", "post_message")),
        st.sampled_from(("fail_before", "fail_after", "hang:0.2")),
    ),
    max_size=2,
    unique_by=lambda f: f[0],
).map(tuple)


@st.composite
def chaos(draw: st.DrawFn, n_calls: int, n_turns: int, use_async: bool) -> tuple[Inject, ...]:
    """A cancel and/or a crash (or a killed task) at a random point of the plan.

    Points are weighted towards tool calls, where the interesting races are.
    """
    tool_at = st.integers(0, n_calls - 1)
    where = draw(st.sampled_from(("tool", "tool", "tool", "turn", "approval", "start")))
    if where == "tool":
        cancel = Inject("cancel", "tool", draw(tool_at), draw(st.sampled_from(("before", "after"))))
    elif where == "turn":
        cancel = Inject("cancel", "turn", draw(st.integers(0, n_turns)))
    elif where == "approval":
        cancel = Inject(
            "cancel", "approval", draw(st.integers(0, 2)), draw(st.sampled_from(("answer", "none")))
        )
    else:
        cancel = Inject("cancel", "start")
    crash = Inject(
        draw(st.sampled_from(("crash", "kill_task", "kill_task") if use_async else ("crash",))),
        "tool",
        draw(tool_at),
        draw(st.sampled_from(("before", "after"))),
    )
    shape = draw(st.sampled_from(("cancel", "crash", "both", "none")))
    picked = {"cancel": (cancel,), "crash": (crash,), "both": (cancel, crash), "none": ()}[shape]
    if shape != "none" and draw(st.integers(0, 2)) == 0:
        # And a crash inside a reconcile or compensate hook: in the middle of a resume's
        # reconciliation, of a cancel's settling, or of a compensation.
        hook = draw(st.sampled_from(("reconcile", "compensate")))
        picked = (*picked, Inject("crash", "hook", draw(st.integers(0, 1)), hook))
    return picked
