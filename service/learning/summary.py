"""``summary.md``: where each candidate beats production and where it loses, from ``results.json``.

Pure formatting of a results document (no simulation), so the table in the
README can be regenerated from any recorded run. A cell reads
``+0.158 [+0.025, +0.290] win``: the candidate's value minus production's
(reward = SLO met per job), the 95% t-interval over seeds, and the verdict
— ``win`` / ``loss`` when the interval excludes zero, ``tie`` otherwise.
"""

from __future__ import annotations

from typing import Any

from service.learning.compare import PRODUCTION, verdict

WORD = {"wins": "win", "loses": "loss", "no difference": "tie"}


def cell(i: dict[str, Any]) -> str:
    """One difference interval as text, with its verdict."""
    if i["mean"] is None:
        return "n/a"
    if i["lo"] is None:
        return f"{i['mean']:+.3f} (one seed: no interval)"
    return f"{i['mean']:+.3f} [{i['lo']:+.3f}, {i['hi']:+.3f}] {WORD[verdict(i)]}"


def by_scenario(results: dict[str, Any], candidates: list[str], truth: str) -> list[str]:
    """Markdown rows: one per scenario, one column per candidate, for `truth`
    (``on_policy`` or ``per_decision``)."""
    head = f"| scenario | production ({truth.replace('_', '-')}) | " + " | ".join(candidates) + " |"
    lines = [head, "|" + "---|" * (len(candidates) + 2)]
    for scenario in results["spec"]["scenarios"]:
        by_policy = results["scenarios"][scenario]
        prod = by_policy[PRODUCTION]["intervals"][truth]["mean"]
        cells = [cell(by_policy[c]["intervals"][f"{truth}_vs_production"]) for c in candidates]
        lines.append(f"| {scenario} | {prod:.3f} | " + " | ".join(cells) + " |")
    return lines


def reliability(results: dict[str, Any], candidates: list[str]) -> list[str]:
    """Markdown rows of the reliability and cost figures (on-policy means over seeds)."""
    keys = ("raw_favourite_infeasible_rate", "error_rate", "voluntary_defer_rate",
            "cost_on_policy", "gap")  # fmt: skip
    lines = ["| scenario | candidate | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 2)]
    for scenario in results["spec"]["scenarios"]:
        by_policy = results["scenarios"][scenario]
        for c in candidates:
            i = by_policy[c]["intervals"]
            lines.append(
                f"| {scenario} | {c} | "
                + " | ".join(
                    f"{i[k]['mean']:.3f}" if i[k]["mean"] is not None else "n/a" for k in keys
                )
                + " |"
            )
    return lines


def summary_markdown(results: dict[str, Any]) -> str:
    """The whole ``summary.md``: both truths by scenario, then reliability."""
    first = next(iter(results["scenarios"].values()))
    candidates = [name for name in first if name != PRODUCTION]
    spec = results["spec"]
    parts = [
        f"Seeds {spec['seeds']}, {spec['episodes']} on-policy episodes per seed,"
        f" {spec['pool_episodes']} forked episodes x {spec['pool_worlds']} worlds per seed.",
        "",
        "On-policy (deployment) truth, candidate - production:",
        "",
        *by_scenario(results, candidates, "on_policy"),
        "",
        "Per-decision (counterfactual) truth, candidate - production:",
        "",
        *by_scenario(results, candidates, "per_decision"),
        "",
        "Reliability and cost (means over seeds):",
        "",
        *reliability(results, candidates),
    ]
    return "\n".join(parts) + "\n"
