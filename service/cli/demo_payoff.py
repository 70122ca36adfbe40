"""What the demo ends with: each candidate's off-policy estimate, and the next commands.

The estimates are `understudy ope`'s own: the same read of the decision log
(`read_ope_log`, no filter) and the same `run_ope` call with the command's
defaults (reward ``slo-met``, DR behind the verdict, 95% intervals), tagged
``simulated`` as ``ope --traffic simulated`` tags them, printed with the table
``ope`` prints at 80 columns (`compact_table`), then the verdicts, grouped.

The next commands are printed with the data directory filled in, each on one
unwrapped line so that it pastes as it is, from the repository root.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from sqlalchemy import Engine

from service.auth import token_digest
from service.cli.ope_table import compact_table
from service.reports.ope.drift_section import build_drift_section
from service.reports.ope.marks import THIN_ESS
from service.reports.ope.ope_run import OpeReport, PolicyReport, Traffic, run_ope
from service.storage.reads.ope import OpeFilter, read_ope_log

_VERDICTS = (
    ("better", "better than production"),
    ("worse", "worse than production"),
    ("no detectable", "no detectable difference"),
    ("not identifiable", "not identifiable"),
    ("no usable", "no usable rounds"),
)
NOTE = (
    "value: the SLO-met share had the candidate decided, estimated off-policy from "
    "production's logged propensities; vs production: the interval of candidate − "
    "production on the same rounds, which gives the verdict; ESS: how many rounds the "
    "estimate is worth (few when the candidate seldom picks what production picked; "
    f"under {THIN_ESS:.0f} it means little). Traffic and outcomes are simulated."
)


def demo_ope(engine: Engine) -> OpeReport:
    """`understudy ope --traffic simulated` on the whole log, as that command computes it."""
    return run_ope(read_ope_log(engine, OpeFilter()), traffic=Traffic.SIMULATED)


def short_verdict(p: PolicyReport) -> str:
    """The verdict without its method (the full sentence is `PolicyReport.verdict`)."""
    for prefix, words in _VERDICTS:
        if p.verdict.startswith(prefix):
            return words
    return p.verdict


def verdict_lines(report: OpeReport) -> list[str]:
    """One line per verdict, naming the candidates that got it."""
    groups: dict[str, list[str]] = {}
    for p in report.policies:
        groups.setdefault(short_verdict(p), []).append(p.policy[0])
    colour = {_VERDICTS[0][1]: "green", _VERDICTS[1][1]: "red"}
    return [
        f"  [{colour.get(word, 'default')}]{word}[/]: {', '.join(names)}"
        for word, names in sorted(groups.items(), key=lambda kv: _order(kv[0]))
    ]


def _order(word: str) -> int:
    return next((i for i, (_, w) in enumerate(_VERDICTS) if w == word), len(_VERDICTS))


def print_ope(console: Console, report: OpeReport) -> list[str]:
    """`ope`'s table at 80 columns, the verdicts and what the columns mean.

    Returns the names of the candidates judged worse than production.
    """
    console.print(compact_table(report))
    console.print("Verdicts, from the interval vs production:", highlight=False)
    for line in verdict_lines(report):
        console.print(line, highlight=False, soft_wrap=True)  # one line per verdict
    console.print(f"[dim]{NOTE}[/]", highlight=False)
    return [p.policy[0] for p in report.policies if short_verdict(p) == _VERDICTS[1][1]]


def drift_lines(engine: Engine, policies_dir: Path) -> list[str]:
    """Input drift per policy, as the evidence package's drift section computes it.

    The live drift monitor closes a window every `drift_window_requests` (4,000 by
    default: more than the demo sends), so the demo reads the section `evidence`
    builds, which sizes its windows to the log.
    """
    section = build_drift_section(engine, OpeFilter(), policies_dir)
    if section is None:
        return []
    parts = []
    for p in section.results["policies"]:
        windows = p["windows"]
        flagged = sum(bool(w["flagged"]) for w in windows)
        psi = {k: v for k, v in p["psi"].items() if v is not None and math.isfinite(v)}
        top = sorted(psi, key=lambda k: -psi[k])[:2]
        detail = f" (most: {', '.join(top)})" if flagged and top else ""
        parts.append(f"{p['policy']} {flagged}/{len(windows)} windows flagged{detail}")
    if not parts:
        return []
    return [
        "Input drift against each policy's training data (`evidence`'s drift section): "
        + "; ".join(parts)
        + ". A flag means the policy now sees requests unlike those of its training summary "
        "(the demo's fleet is larger and emptier than the `train` scenario's): its "
        "estimates are about inputs it did not learn from; `evidence` names the features."
    ]


@dataclass(frozen=True)
class NextCommands:
    """What a newcomer can type next, on the log the demo left."""

    data_dir: str
    request_id: str
    policy: str
    protocol: str
    reviewer_token: str
    http_port: int = 8080

    def lines(self) -> list[tuple[str, str]]:
        """(what, command) pairs, in the order a newcomer would try them."""
        env = f"UNDERSTUDY_DATA_DIR={shlex.quote(self.data_dir)}"
        evidence = f"{self.data_dir.rstrip('/')}/evidence"
        tokens = shlex.quote(f'{{"{token_digest(self.reviewer_token)}": "reviewer:rita"}}')
        serve_env = f"{env} UNDERSTUDY_HTTP_PORT={self.http_port} UNDERSTUDY_AUTH_TOKENS={tokens}"
        base = f"http://127.0.0.1:{self.http_port}"
        return [
            (
                "every policy estimated off-policy, all estimators",
                f"{env} .venv/bin/understudy ope --traffic simulated",
            ),
            (
                f"the evidence package (then open {evidence}/index.html)",
                f"{env} .venv/bin/understudy evidence --traffic simulated --out {evidence}",
            ),
            (
                f"recompute one logged decision of {self.policy} from the stored request",
                f"{env} .venv/bin/understudy replay --request-id {self.request_id} "
                f"--policy {self.policy}",
            ),
            (
                'reviewer API: serve the log, wait for "listening", ask why it stopped',
                f"{serve_env} .venv/bin/understudy serve &",
            ),
            (
                "",
                f"curl -s -H 'authorization: Bearer {self.reviewer_token}' "
                f"{base}/v1/reviewer/experiments/{self.protocol}/versions/1/events",
            ),
            ("", "kill %1   # stops that server"),
        ]


def print_next(console: Console, commands: NextCommands) -> None:
    """The next commands, each on one line that pastes as it is (no hard wrap)."""
    console.print(f"[bold]Next[/], on the log left in {commands.data_dir}/ (from the repo root):")
    for what, command in commands.lines():
        if what:
            console.print(f"  [dim]# {what}[/]", highlight=False, soft_wrap=True)
        console.print(f"  {command}", soft_wrap=True, highlight=False, markup=False)
