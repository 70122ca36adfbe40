"""What is known of a cluster snapshot shared by many requests: its digest, its validity.

Runtime decides many pods per scheduling cycle against one snapshot, and the
service's snapshot cache (`service.wire.snapshot_cache`) hands the requests of
one cycle the *same* decoded `ClusterState`. Hashing it (`state_digest`) and
checking it (`validate_state`) are functions of the state alone (and of the
limits, for the check), so they are done once per shared state and remembered
here, not once per request.

Exact: only a state the service decoded itself and shares by reference is
marked (`share`); such a state is immutable (a frozen dataclass of tuples,
frozensets and read-only arrays that nobody else holds), so what is remembered
of it cannot go stale. States are keyed by the object itself (the class
compares by identity, ``eq=False``) and held weakly: an entry goes with its
state, before its identity could name another object. A state built elsewhere
(whose caller might still hold writable arrays) is never marked, and is hashed
and checked every time.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from service.contract.state import ClusterState


@dataclass(slots=True)
class SharedFacts:
    """What has been computed of one shared state (None: not yet)."""

    digest: bytes | None = None
    """sha256 of its canonical encoding (`service.contract.batch.identity`)."""
    valid_under: Any = None
    """The `RequestLimits` it passed `validate_state` under (it is checked again under others)."""


_FACTS: weakref.WeakKeyDictionary[ClusterState, SharedFacts] = weakref.WeakKeyDictionary()


def share(state: ClusterState) -> None:
    """Mark `state` as decoded by the service and shared: its digest and check are kept."""
    if state not in _FACTS:
        _FACTS[state] = SharedFacts()


def facts(state: ClusterState) -> SharedFacts | None:
    """What is kept of `state`, or None when it is not a shared state."""
    return _FACTS.get(state)
