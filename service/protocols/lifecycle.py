"""The lifecycle of a recorded protocol, and who may move it.

::

    (none) --submit--> draft --approve--> approved --start--> running
                         |  \\___________start (shadow only)___/   |
                         |                                        +--complete-------> completed
                         +--stop--> stopped <--stop-- approved    +--inconclusive---> inconclusive
                                       ^                          +--stop-----------> stopped
                                       +------stop-- rollback-signalled <--signal-rollback (online)

`stopped`, `completed` and `inconclusive` are final. `inconclusive` (maximum
duration without a verdict, or data too poor to judge) hands the experiment to
a human, as Argo Rollouts does; a re-run is a new version.

Authority is independent of the experiment: approval of an online-bounded
protocol must come from the `safety` role held by someone who is neither an
owner nor the submitter, and `admin` cannot approve (although elsewhere admin
passes every role check). Verdicts (complete, inconclusive) come only from
the evaluator, acting as the `system` role; stopping is always allowed to
admin and safety, because stopping can only reduce what a candidate does.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from service.contract.errors import Conflict, PermissionDenied
from service.protocols.schema import Mode


class State(StrEnum):
    """Where a recorded protocol version is."""

    DRAFT = "draft"
    APPROVED = "approved"
    RUNNING = "running"
    ROLLBACK_SIGNALLED = "rollback-signalled"
    STOPPED = "stopped"
    COMPLETED = "completed"
    INCONCLUSIVE = "inconclusive"

    @property
    def is_final(self) -> bool:
        """No transition leaves a final state."""
        return self in (State.STOPPED, State.COMPLETED, State.INCONCLUSIVE)

    @property
    def is_evaluated(self) -> bool:
        """The evaluator watches these (a rollback signal does not end monitoring)."""
        return self in (State.RUNNING, State.ROLLBACK_SIGNALLED)


class Action(StrEnum):
    """A transition's name, as recorded in the event row."""

    SUBMIT = "submit"
    APPROVE = "approve"
    START = "start"
    STOP = "stop"
    COMPLETE = "complete"
    DECLARE_INCONCLUSIVE = "inconclusive"
    SIGNAL_ROLLBACK = "signal-rollback"


class ActorRole(StrEnum):
    """The roles of `service.auth.Role`, plus `system` for the evaluator (no token has it)."""

    RUNTIME = "runtime"
    REVIEWER = "reviewer"
    SAFETY = "safety"
    ADMIN = "admin"
    SYSTEM = "system"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is calling: a principal name (matched against `owners`) and its role."""

    principal: str
    role: ActorRole

    def __str__(self) -> str:
        return f"{self.principal} ({self.role.value})"


EVALUATOR = Identity("understudy-evaluator", ActorRole.SYSTEM)
"""The identity verdicts are recorded under."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One transition: the states it leaves from, where it goes, who may take it."""

    sources: frozenset[State | None]
    target: State
    roles: frozenset[ActorRole]


def _rule(sources: Collection[State | None], target: State, *roles: ActorRole) -> Rule:
    return Rule(frozenset(sources), target, frozenset(roles))


RULES: Mapping[Action, Rule] = MappingProxyType(
    {
        Action.SUBMIT: _rule([None], State.DRAFT, ActorRole.ADMIN),
        Action.APPROVE: _rule([State.DRAFT], State.APPROVED, ActorRole.SAFETY),
        Action.START: _rule([State.DRAFT, State.APPROVED], State.RUNNING, ActorRole.ADMIN),
        Action.STOP: _rule(
            [State.DRAFT, State.APPROVED, State.RUNNING, State.ROLLBACK_SIGNALLED],
            State.STOPPED,
            ActorRole.ADMIN,
            ActorRole.SAFETY,
            ActorRole.SYSTEM,
        ),
        Action.COMPLETE: _rule([State.RUNNING], State.COMPLETED, ActorRole.SYSTEM),
        Action.DECLARE_INCONCLUSIVE: _rule(
            [State.RUNNING, State.ROLLBACK_SIGNALLED], State.INCONCLUSIVE, ActorRole.SYSTEM
        ),
        Action.SIGNAL_ROLLBACK: _rule(
            [State.RUNNING], State.ROLLBACK_SIGNALLED, ActorRole.SAFETY, ActorRole.SYSTEM
        ),
    }
)
"""Every allowed transition; anything else is refused."""

READ_ROLES = frozenset({ActorRole.REVIEWER, ActorRole.SAFETY, ActorRole.ADMIN, ActorRole.SYSTEM})
"""Who may read protocols, their state and events (Runtime may not)."""

OWNER_ACTIONS = frozenset({Action.SUBMIT, Action.START})
"""Actions only an owner (holding the rule's role) may take."""


def next_state(action: Action, current: State | None, mode: Mode) -> State:
    """The state `action` leads to from `current`, or raise `Conflict` saying why not."""
    rule = RULES[action]
    if action is Action.START and mode is Mode.ONLINE_BOUNDED and current in (None, State.DRAFT):
        raise Conflict(
            "cannot start: an `online-bounded` protocol starts only after approval by the"
            f" `safety` role; it is {current.value if current else 'not recorded'}"
        )
    if current not in rule.sources:
        allowed = ", ".join(sorted(s.value if s else "(not recorded)" for s in rule.sources))
        now = current.value if current else "not recorded"
        raise Conflict(f"cannot {action.value}: the protocol is {now}; allowed from: {allowed}")
    if action is Action.SIGNAL_ROLLBACK and mode is not Mode.ONLINE_BOUNDED:
        raise Conflict(
            "cannot signal rollback: only `online-bounded` protocols act, this is shadow"
        )
    return rule.target


def authorize_role(action: Action, who: Identity) -> None:
    """Raise `PermissionDenied` unless `who`'s role may ever take `action`.

    Needs no record, so callers run it before looking one up: a token without
    the role must not learn from a 404 which protocols exist.
    """
    rule = RULES[action]
    if action is Action.APPROVE and who.role is ActorRole.ADMIN:
        raise PermissionDenied(
            "role `admin` cannot approve: approval must come from the independent `safety` role"
        )
    if who.role not in rule.roles:
        names = ", ".join(sorted(r.value for r in rule.roles))
        raise PermissionDenied(
            f"role `{who.role.value}` may not {action.value} a protocol; needs one of: {names}"
        )


def authorize(
    action: Action, who: Identity, owners: Collection[str], submitted_by: str | None
) -> None:
    """Raise `PermissionDenied` unless `who` may take `action` on a protocol.

    Args:
        action: the transition asked for.
        who: the caller.
        owners: the protocol's owners (principal names).
        submitted_by: the principal that recorded the draft (None before it is).
    """
    authorize_role(action, who)
    if action is Action.APPROVE and (who.principal in owners or who.principal == submitted_by):
        raise PermissionDenied(
            f"`{who.principal}` owns or submitted this protocol and cannot approve it;"
            " approval must come from someone independent of the experiment"
        )
    if action in OWNER_ACTIONS and who.principal not in owners:
        raise PermissionDenied(
            f"`{who.principal}` may not {action.value} this protocol: not one of its `owners`"
            f" ({', '.join(sorted(owners))})"
        )


def authorize_read(who: Identity) -> None:
    """Raise `PermissionDenied` unless `who` may read protocols and events."""
    if who.role not in READ_ROLES:
        names = ", ".join(sorted(r.value for r in READ_ROLES))
        raise PermissionDenied(
            f"role `{who.role.value}` may not read protocols; needs one of: {names}"
        )
