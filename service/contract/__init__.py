"""The compute-environment contract: pure, typed, no I/O.

State, workload, placement options and actions, feasibility with named
constraint signals, outcomes, reward and cost declarations, the versioned
feature function, validation and the error tree. Everything else in Understudy
speaks these types; transports convert to them at the edge.
"""

from service.contract.actions import DEFER, PlacementOptions, single_node_options
from service.contract.errors import (
    AuthError,
    Conflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    UnderstudyError,
    UnsupportedSchemaVersion,
)
from service.contract.feasibility import (
    FEASIBILITY_VERSION,
    SIGNALS,
    ConstraintSignal,
    Feasibility,
    check_feasibility,
)
from service.contract.features import (
    DEFAULT_FEATURES,
    FEATURE_NAMES,
    FEATURE_VERSION,
    N_FEATURES,
    FeatureConstants,
    FeatureFunction,
)
from service.contract.hardware import KNOWN_HARDWARE, HardwareClass, is_known_class
from service.contract.outcome import FailureKind, Outcome
from service.contract.request import (
    SCHEMA_VERSION,
    MirrorRequest,
    ProductionDecision,
)
from service.contract.reward import REWARD_FIELDS, CostSpec, RewardSpec
from service.contract.state import ClusterState
from service.contract.validation import (
    RequestLimits,
    validate_outcome,
    validate_request,
)
from service.contract.workload import Workload, WorkloadKind

__all__ = [
    "DEFAULT_FEATURES",
    "DEFER",
    "FEASIBILITY_VERSION",
    "FEATURE_NAMES",
    "FEATURE_VERSION",
    "KNOWN_HARDWARE",
    "N_FEATURES",
    "REWARD_FIELDS",
    "SCHEMA_VERSION",
    "SIGNALS",
    "AuthError",
    "ClusterState",
    "Conflict",
    "ConstraintSignal",
    "CostSpec",
    "FailureKind",
    "Feasibility",
    "FeatureConstants",
    "FeatureFunction",
    "HardwareClass",
    "InvalidInput",
    "MirrorRequest",
    "NotFound",
    "Outcome",
    "PayloadTooLarge",
    "PermissionDenied",
    "PlacementOptions",
    "ProductionDecision",
    "RequestLimits",
    "RewardSpec",
    "Unauthenticated",
    "Unavailable",
    "UnderstudyError",
    "UnsupportedSchemaVersion",
    "Workload",
    "WorkloadKind",
    "check_feasibility",
    "is_known_class",
    "single_node_options",
    "validate_outcome",
    "validate_request",
]
