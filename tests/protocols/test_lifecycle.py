"""Who may move a protocol, and where: the rules as tables."""

from __future__ import annotations

import pytest

from service.auth import Role
from service.contract.errors import Conflict, PermissionDenied
from service.protocols import RULES, Action, ActorRole, Identity, Mode, State, authorize, next_state
from service.protocols.lifecycle import authorize_read

OWNERS = ("alice", "bob")
ALICE_ADMIN = Identity("alice", ActorRole.ADMIN)
ROOT_ADMIN = Identity("root", ActorRole.ADMIN)
DAVE_SAFETY = Identity("dave", ActorRole.SAFETY)
ALICE_SAFETY = Identity("alice", ActorRole.SAFETY)
CAROL_SAFETY = Identity("carol", ActorRole.SAFETY)  # submitted it, not an owner
RITA_REVIEWER = Identity("rita", ActorRole.REVIEWER)
RUNTIME = Identity("rt", ActorRole.RUNTIME)
EVALUATOR = Identity("evaluator", ActorRole.SYSTEM)

AUTH_CASES = [
    # (action, who, allowed)
    (Action.APPROVE, DAVE_SAFETY, True),
    (Action.APPROVE, ALICE_SAFETY, False),  # an owner, even holding safety
    (Action.APPROVE, CAROL_SAFETY, False),  # the submitter
    (Action.APPROVE, ALICE_ADMIN, False),
    (Action.APPROVE, ROOT_ADMIN, False),  # admin cannot approve, even a non-owner
    (Action.APPROVE, RITA_REVIEWER, False),
    (Action.APPROVE, RUNTIME, False),
    (Action.APPROVE, EVALUATOR, False),
    (Action.SUBMIT, ALICE_ADMIN, True),
    (Action.SUBMIT, ROOT_ADMIN, False),  # not an owner
    (Action.SUBMIT, DAVE_SAFETY, False),
    (Action.START, ALICE_ADMIN, True),
    (Action.START, ROOT_ADMIN, False),
    (Action.START, DAVE_SAFETY, False),
    (Action.START, RITA_REVIEWER, False),
    (Action.STOP, ALICE_ADMIN, True),
    (Action.STOP, ROOT_ADMIN, True),  # stopping only ever reduces what a candidate does
    (Action.STOP, DAVE_SAFETY, True),
    (Action.STOP, EVALUATOR, True),
    (Action.STOP, RITA_REVIEWER, False),
    (Action.STOP, RUNTIME, False),
    (Action.COMPLETE, EVALUATOR, True),
    (Action.COMPLETE, ALICE_ADMIN, False),
    (Action.DECLARE_INCONCLUSIVE, EVALUATOR, True),
    (Action.DECLARE_INCONCLUSIVE, DAVE_SAFETY, False),
    (Action.SIGNAL_ROLLBACK, DAVE_SAFETY, True),
    (Action.SIGNAL_ROLLBACK, EVALUATOR, True),
    (Action.SIGNAL_ROLLBACK, ALICE_ADMIN, False),
]


@pytest.mark.parametrize(("action", "who", "allowed"), AUTH_CASES, ids=str)
def test_authorization_table(action: Action, who: Identity, allowed: bool) -> None:
    if allowed:
        authorize(action, who, OWNERS, "carol")
    else:
        with pytest.raises(PermissionDenied):
            authorize(action, who, OWNERS, "carol")


def test_admin_refusal_says_why() -> None:
    with pytest.raises(PermissionDenied, match="`admin` cannot approve"):
        authorize(Action.APPROVE, ROOT_ADMIN, OWNERS, "alice")
    with pytest.raises(PermissionDenied, match="owns or submitted"):
        authorize(Action.APPROVE, ALICE_SAFETY, OWNERS, "alice")


TRANSITIONS = [
    # (action, from, mode, to or None when refused)
    (Action.SUBMIT, None, Mode.SHADOW, State.DRAFT),
    (Action.SUBMIT, State.DRAFT, Mode.SHADOW, None),
    (Action.APPROVE, State.DRAFT, Mode.ONLINE_BOUNDED, State.APPROVED),
    (Action.APPROVE, State.APPROVED, Mode.ONLINE_BOUNDED, None),
    (Action.START, State.APPROVED, Mode.ONLINE_BOUNDED, State.RUNNING),
    (Action.START, State.DRAFT, Mode.ONLINE_BOUNDED, None),  # unapproved online
    (Action.START, State.DRAFT, Mode.SHADOW, State.RUNNING),
    (Action.START, State.RUNNING, Mode.SHADOW, None),
    (Action.STOP, State.RUNNING, Mode.SHADOW, State.STOPPED),
    (Action.STOP, State.DRAFT, Mode.SHADOW, State.STOPPED),
    (Action.STOP, State.ROLLBACK_SIGNALLED, Mode.ONLINE_BOUNDED, State.STOPPED),
    (Action.STOP, State.COMPLETED, Mode.SHADOW, None),
    (Action.STOP, State.STOPPED, Mode.SHADOW, None),
    (Action.COMPLETE, State.RUNNING, Mode.SHADOW, State.COMPLETED),
    (Action.COMPLETE, State.ROLLBACK_SIGNALLED, Mode.ONLINE_BOUNDED, None),
    (Action.DECLARE_INCONCLUSIVE, State.RUNNING, Mode.SHADOW, State.INCONCLUSIVE),
    (Action.SIGNAL_ROLLBACK, State.RUNNING, Mode.ONLINE_BOUNDED, State.ROLLBACK_SIGNALLED),
    (Action.SIGNAL_ROLLBACK, State.RUNNING, Mode.SHADOW, None),
    (Action.START, State.INCONCLUSIVE, Mode.SHADOW, None),
]


@pytest.mark.parametrize(("action", "current", "mode", "target"), TRANSITIONS, ids=str)
def test_transition_table(
    action: Action, current: State | None, mode: Mode, target: State | None
) -> None:
    if target is None:
        with pytest.raises(Conflict):
            next_state(action, current, mode)
    else:
        assert next_state(action, current, mode) is target


def test_unapproved_online_start_says_it_needs_safety_approval() -> None:
    with pytest.raises(Conflict, match="only after approval by the `safety` role"):
        next_state(Action.START, State.DRAFT, Mode.ONLINE_BOUNDED)


def test_final_states_have_no_way_out() -> None:
    for state in State:
        leaves = [a for a, rule in RULES.items() if state in rule.sources]
        assert (leaves == []) == state.is_final, state


def test_reading_needs_a_reading_role() -> None:
    for who in (RITA_REVIEWER, DAVE_SAFETY, ALICE_ADMIN, EVALUATOR):
        authorize_read(who)
    with pytest.raises(PermissionDenied):
        authorize_read(RUNTIME)


def test_actor_roles_cover_the_token_roles() -> None:
    assert {r.value for r in Role} | {"system"} == {r.value for r in ActorRole}
