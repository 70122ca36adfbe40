"""From evaluations to at most one transition: the order in which criteria act.

1. online and running: a fired rollback criterion or an authority breach ->
   signal rollback (a signal for Runtime and Safety; Understudy never acts);
2. a fired stop criterion -> stop;
3. a fired data-quality criterion, or off-policy criteria that are not
   identifiable after `minimum_samples` -> inconclusive (data too poor to judge);
4. running, the primary passed and every guardrail passed -> complete;
5. the maximum duration passed without a verdict -> inconclusive.

A rollback-signalled experiment is still evaluated: it may be stopped or
declared inconclusive, but not completed and not signalled twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.protocols.criteria import Evaluation, Role, Status
from service.protocols.lifecycle import Action, State
from service.protocols.schema import Mode


@dataclass(frozen=True, slots=True)
class Verdict:
    """A transition the evaluator should apply, and the evaluation that caused it."""

    action: Action
    criterion: str
    reason: str
    evaluation: Evaluation


def limit_evaluation(
    name: str,
    metric: str,
    fired: bool,
    value: float | None,
    threshold: float,
    n: int,
    note: str = "",
    role: Role = Role.LIMIT,
) -> Evaluation:
    """A built-in limit (duration, identifiability, authority) as an evaluation row."""
    return Evaluation(
        name=name,
        role=role,
        metric=metric,
        status=Status.FIRED if fired else Status.PENDING,
        value=value,
        bound=value,
        threshold=threshold,
        lower=None,
        upper=None,
        n=n,
        alpha=0.0,
        method="rule",
        note=note,
    )


def _describe(e: Evaluation, action: Action) -> str:
    if e.role is Role.LIMIT or e.name == "authority":
        detail = e.note or f"{e.metric} {e.value} beyond {e.threshold}"
        return f"{action.value}: `{e.name}` ({detail})"
    return (
        f"{action.value}: `{e.name}` ({e.role.value}) {e.status.value}: {e.metric} estimate"
        f" {e.value:.4g}, bound {e.bound:.4g} vs threshold {e.threshold:.4g} at n={e.n}"
        f" (alpha {e.alpha:.3g}, {e.method})"
    )


def decide(evaluations: Sequence[Evaluation], state: State, mode: Mode) -> Verdict | None:
    """At most one transition from the evaluations now (module docstring order)."""

    def first(role: Role, *names: str) -> Evaluation | None:
        for e in evaluations:
            if e.role is role and e.status is Status.FIRED and (not names or e.name in names):
                return e
        return None

    candidates: list[tuple[Action, Evaluation | None]] = []
    if state is State.RUNNING and mode is Mode.ONLINE_BOUNDED:
        candidates.append((Action.SIGNAL_ROLLBACK, first(Role.ROLLBACK)))
    candidates.append((Action.STOP, first(Role.STOP)))
    candidates.append((Action.DECLARE_INCONCLUSIVE, first(Role.DATA_QUALITY)))
    candidates.append((Action.DECLARE_INCONCLUSIVE, first(Role.LIMIT, "identifiability")))
    if state is State.RUNNING:
        primary = [e for e in evaluations if e.role is Role.PRIMARY]
        guards = [e for e in evaluations if e.role is Role.GUARDRAIL]
        if primary and all(e.status is Status.PASSED for e in (*primary, *guards)):
            candidates.append((Action.COMPLETE, primary[0]))
    candidates.append((Action.DECLARE_INCONCLUSIVE, first(Role.LIMIT, "max_duration")))
    for action, e in candidates:
        if e is not None:
            return Verdict(action, e.name, _describe(e, action), e)
    return None
