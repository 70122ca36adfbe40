"""Off-policy evaluation: estimators, intervals, confidence sequences, overlap diagnostics.

Pure numpy/scipy over arrays; imports nothing of the project but
`service.contract` (a test walks the imports). Layers, inner to outer::

    results      Estimate / NotIdentifiable / Interval / Diagnostics, enums
    data         BanditData (validated arrays), screen_pscore, one_hot
    kernels      every estimator as V = mean(d) + sum(c) / sum(m); Moments
    tail         Pareto k-hat, the E[w] = 1 test, the top-1% share (mergeable sketch)
    diagnostics  ESS, weight tail, support, identifiability, caveats
    intervals    normal, seeded percentile bootstrap, Clopper-Pearson
    estimators   dm, ips, snips, dr, sndr, switch_dr, estimate
    slices       diagnostics and estimates per slice
    sequences    anytime-valid: asymptotic, betting, off-policy betting, proportion
    streaming    StreamingEstimator from sufficient statistics, round_values
    comparison   which interval a verdict may rest on under the weight diagnostics

See docs/ope.md for the formulas, assumptions and how the tests check them.
"""

from service.ope.data import BanditData, PropensityScreen, one_hot, screen_pscore
from service.ope.diagnostics import (
    MIN_ESS,
    TAIL_THRESHOLD,
    DiagnosticSums,
    diagnostics,
    identification_failure,
    unsupported_mass,
)
from service.ope.estimators import SWITCH_TAU, dm, dr, estimate, ips, sndr, snips, switch_dr
from service.ope.intervals import Bootstrap, clopper_pearson, normal_interval
from service.ope.results import (
    Basis,
    Diagnostics,
    Estimate,
    Estimator,
    Interval,
    IntervalMethod,
    NotIdentifiable,
    Result,
)
from service.ope.sequences import (
    AsymptoticCS,
    BettingCS,
    OffPolicyBettingCS,
    PairedOffPolicyBettingCS,
    ProportionCS,
    asymptotic_rho,
)
from service.ope.slices import (
    SliceDiagnostics,
    SliceEstimate,
    diagnostics_by_slice,
    estimate_by_slice,
)
from service.ope.streaming import StreamingEstimator, round_values

__all__ = [
    "MIN_ESS",
    "SWITCH_TAU",
    "TAIL_THRESHOLD",
    "AsymptoticCS",
    "BanditData",
    "Basis",
    "BettingCS",
    "Bootstrap",
    "DiagnosticSums",
    "Diagnostics",
    "Estimate",
    "Estimator",
    "Interval",
    "IntervalMethod",
    "NotIdentifiable",
    "OffPolicyBettingCS",
    "PairedOffPolicyBettingCS",
    "PropensityScreen",
    "ProportionCS",
    "Result",
    "SliceDiagnostics",
    "SliceEstimate",
    "StreamingEstimator",
    "asymptotic_rho",
    "clopper_pearson",
    "diagnostics",
    "diagnostics_by_slice",
    "dm",
    "dr",
    "estimate",
    "estimate_by_slice",
    "identification_failure",
    "ips",
    "normal_interval",
    "one_hot",
    "round_values",
    "screen_pscore",
    "sndr",
    "snips",
    "switch_dr",
    "unsupported_mass",
]
