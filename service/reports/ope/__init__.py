"""Offline evaluation reports over the decision log: `understudy ope` and `understudy evidence`.

Layers, inner to outer::

    arrays       OpeLog -> BanditData per policy (reward, production's action/propensity, targets)
    ope_run      estimates, paired difference to production, verdicts, provenance
    summary      results as JSON and table rows
    limitations  "known limitations and assumptions" from the diagnostics
    figures      PNG plots (estimates with intervals, per slice, weights)
    decoded      what only the stored requests know: option hardware, chosen options,
                 the outcome predictor's quantiles per option
    sections     `ReportSection`, the interface of every extra section
    failure_section, online_section (and calibration/drift from their owners)
    package      the package folder: index.html, report.md, results.json, figures/

Reading the log is ``service.storage.reads.ope``; the commands are
``service.cli.evaluation``. See docs/evidence.md.
"""

from service.reports.ope.arrays import Reward, policy_rounds
from service.reports.ope.ope_run import OpeReport, PolicyReport, Provenance, Traffic, run_ope
from service.reports.ope.package import OpePackage, build_ope_package
from service.reports.ope.sections import ReportSection

__all__ = [
    "OpePackage",
    "OpeReport",
    "PolicyReport",
    "Provenance",
    "ReportSection",
    "Reward",
    "Traffic",
    "build_ope_package",
    "policy_rounds",
    "run_ope",
]
