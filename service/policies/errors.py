"""Errors raised by policies, predictors and the registry.

They extend the contract's tree, so transports map them like any other
`UnderstudyError`::

    UnderstudyError
     └── PolicyError                 names the policy
          ├── PolicyLoadError         a manifest or artifact refused at load
          ├── PolicyScoringError      a loaded policy failed on one batch
          └── PolicyConformanceError  `check_policy` found broken invariants

A load error is fatal for that one policy only: the registry records it and
loads the rest. A scoring error is fatal for that policy's decisions on that
batch only: the runner turns it into ``DecisionStatus.ERROR``.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.contract.errors import UnderstudyError


class PolicyError(UnderstudyError):
    """Raised when a named policy or predictor cannot do its job."""

    def __init__(self, policy: str, problem: str) -> None:
        self.policy = policy
        self.problem = problem
        super().__init__(f"policy `{policy}`: {problem}")


class PolicyLoadError(PolicyError):
    """Raised when a manifest or model artifact is refused at load time."""


class PolicyScoringError(PolicyError):
    """Raised when a loaded policy fails or returns non-finite output on a batch."""


class PolicyConformanceError(PolicyError):
    """Raised when `check_policy` finds decisions that break the Policy contract.

    `problems` lists every broken invariant, not only the first, so one run
    of the checker tells the author everything to fix.
    """

    def __init__(self, policy: str, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(policy, "fails check_policy: " + "; ".join(self.problems))
