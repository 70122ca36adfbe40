"""The "known limitations and assumptions" section, generated from the diagnostics.

Two parts: the standing assumptions of OPE on this log (always listed: they
hold for every estimate, whatever the data says), and findings read off this
report's numbers (no overlap, small ESS, heavy weight tails — the Pareto k-hat
and the E[w] = 1 test, explained as an unseen tail, missing support or wrong
propensities by ``service.ope.diagnostics.weight_caveats`` — dropped rounds,
deterministic logging, infeasible raw favourites, the constant DR model, the
provenance of the numbers). Each finding names the policy it is about.
"""

from __future__ import annotations

import math

from service.ope import MIN_ESS, Estimate, NotIdentifiable
from service.reports.ope.ope_run import (
    CONSTANT_MODEL_CAVEAT,
    SLICE_TITLES,
    OpeReport,
    PolicyReport,
    Provenance,
)

ASSUMPTIONS = (
    "Estimand: the per-decision value — what the policy would have got one decision at a "
    "time with production making every other decision. Interference between decisions "
    "(a placement changing later cluster state) is not seen by any estimator here.",
    "Rounds are assumed independent given the logging policy; estimate intervals are normal "
    "(CLT) at the sample size shown and are not anytime-valid: do not re-check them "
    "after every batch. Where the weight tail is heavy (Pareto k-hat >= 0.5) a normal "
    "interval is not a valid interval at its level; verdicts rest on the paired "
    "off-policy betting interval, whose coverage held in every cell of docs/ope.md's table.",
    "Production's logged propensities are assumed correct; rounds without one are left "
    "out and assumed missing at random.",
    "Rounds without a joined outcome are not in the log read here; outcomes are assumed "
    "missing at random (a job that never reports is not a failure here).",
    "The policies' logged probabilities (the `probabilities_f64` blob plus the defer "
    "probability) are the target distributions; DEFER is one more action column.",
    "Support is checked only where production's propensity is 1 (the full logging "
    "distribution is not logged), so unsupported actions elsewhere go unnoticed.",
    f"DR: {CONSTANT_MODEL_CAVEAT}; no option features are decoded from the stored requests.",
    "A decision logged with status `timeout` is the policy's fallback distribution; it is "
    "what is estimated on those rounds (the share is listed per policy).",
)
GENERAL = ("support checked only where", CONSTANT_MODEL_CAVEAT)
"""Caveats every estimate here carries; stated once under the assumptions."""


def _policy_findings(p: PolicyReport, level: float) -> list[str]:
    out: list[str] = []
    r = p.primary_result
    if p.n == 0:
        out.append(f"no usable rounds ({p.dropped.total} left out); nothing is estimated.")
        return out
    if isinstance(r, NotIdentifiable):
        out.append(f"not identifiable, no number is reported: {r.reason}.")
    if isinstance(r, Estimate):
        d = r.diagnostics
        if d.ess < MIN_ESS and not any(c.startswith("effective sample size") for c in r.caveats):
            out.append(
                f"effective sample size {d.ess:.1f} of {d.n} rounds is below "
                f"{MIN_ESS:.0f}; the {level:.0%} interval may under-cover."
            )
        if d.tail_weight_share > 0.1:
            out.append(
                f"{d.tail_weight_share:.0%} of the importance weight sits on rounds "
                f"with weight > {d.tail_threshold:g} (max {d.max_weight:.3g}); a few "
                "decisions drive the estimate."
            )
        if d.deterministic_share > 0.5:
            out.append(
                f"production was deterministic in {d.deterministic_share:.0%} of the "
                "decisions that had a choice; overlap is thin."
            )
        out += [f"{c}." for c in r.caveats if not c.startswith(GENERAL)]
    if p.dropped.total:
        out.append(
            f"{p.dropped.total} rounds left out (no reward {p.dropped.no_reward}, "
            f"no production decision or propensity {p.dropped.no_production}, no usable "
            f"distribution, e.g. status `error`, {p.dropped.no_target}); the estimate is "
            "for the rounds kept, assuming they were left out at random."
        )
    if not math.isnan(p.infeasible_favourites) and p.infeasible_favourites > 0:
        out.append(
            f"its raw favourite was infeasible in {p.infeasible_favourites:.1%} of its "
            "decisions (masked before acting; a reliability signal, not in the reward)."
        )
    if p.timeout_share > 0:
        out.append(
            f"{p.timeout_share:.1%} of its used decisions timed out; there the fallback "
            "distribution is what is estimated, not the model's."
        )
    for dimension, by_label in p.slices.items():
        refused = sorted(k for k, s in by_label.items() if isinstance(s, NotIdentifiable))
        if refused:
            name = SLICE_TITLES.get(dimension, dimension)
            out.append(f"not identifiable in {name} slice(s) {', '.join(refused)}.")
    return out


def _merged(findings: list[tuple[str, str]]) -> list[str]:
    """One line per finding text, naming every policy it holds for."""
    by_text: dict[str, list[str]] = {}
    for who, text in findings:
        by_text.setdefault(text, []).append(who)
    return [f"{', '.join(whos)}: {text}" for text, whos in by_text.items()]


def limitations(report: OpeReport, *, online_bounded: bool = False) -> list[str]:
    """Findings from `report`'s diagnostics, most general first.

    `online_bounded` says whether the package also carries online-bounded numbers
    (a section built from the evaluator's stored evaluations).
    """
    out: list[str] = []
    online = (
        "online-bounded numbers (from online protocols in which a candidate acted) are "
        "in their own section and tagged so"
        if online_bounded
        else "no online-bounded evidence is included in this package"
    )
    if report.provenance is Provenance.SIMULATED:
        out.append(
            "Every off-policy number here comes from simulated traffic and outcomes (the "
            f"simulator's production emulator), not from production: simulation evidence; {online}."
        )
    else:
        out.append(
            f"Every off-policy candidate number is shadow-logged: no candidate acted; {online}."
        )
    if report.rounds == 0:
        out.append("The log holds no joined rounds in the selected window: nothing is estimated.")
    findings: list[tuple[str, str]] = []
    for p in report.policies:
        findings += [(f"`{p.label}`", text) for text in _policy_findings(p, report.level)]
    return out + _merged(findings)
