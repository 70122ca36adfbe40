"""`make bench`: every figure beside the raw limit of its own stack, measured in the same run.

``python -m benchmarks [NAME ...] [--quick] [--long]``. Names: scoring,
decision_log, ope, e2e, batch_ingest, rss, capacity (default: all). ``--quick`` (or
``UNDERSTUDY_BENCH_QUICK=1``) is a smoke run: short, few repeats, figures not
to be quoted. ``--long`` runs the RSS benchmark for 5 minutes instead of 3.
Results: ``benchmarks/results/<name>.json`` (``$UNDERSTUDY_BENCH_OUT``
overrides) and ``summary.md`` beside them; the table is printed at the end.

Benchmarks start and stop their own processes (by pid), send traffic only to
loopback and are bounded in count and time (under 15 minutes in all on the
2-core reference machine, plus ~9 for batch_ingest's 14 points; its quick run
takes ~2.5).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from rich.console import Console

from benchmarks import batch_ingest, capacity_points, decision_log, e2e, ope, rss, scoring
from benchmarks.harness import BenchResult, write_result
from benchmarks.report import write_summary

BENCHMARKS: dict[str, Callable[[bool, bool], BenchResult]] = {
    "scoring": lambda quick, long: scoring.run(quick),
    "decision_log": lambda quick, long: decision_log.run(quick),
    "ope": lambda quick, long: ope.run(quick),
    "e2e": lambda quick, long: e2e.run(quick),
    "batch_ingest": lambda quick, long: batch_ingest.run(quick),
    "capacity": lambda quick, long: capacity_points.run(quick),
    "rss": lambda quick, long: rss.run(quick, long),
}


def main() -> None:
    """Run the chosen benchmarks, write results and the summary."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(BENCHMARKS))
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--long", action="store_true", help="5 minutes of overload for RSS")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    quick = args.quick or os.environ.get("UNDERSTUDY_BENCH_QUICK", "") not in ("", "0")
    console = Console()
    started = time.monotonic()
    failed: list[str] = []
    for name in args.names or list(BENCHMARKS):
        t0 = time.monotonic()
        try:
            with console.status(f"{name}{' (quick)' if quick else ''}"):
                result = BENCHMARKS[name](quick, args.long)
        except Exception as exc:  # report it, run the others, fail at the end
            console.print(f"[red]{name} failed: {type(exc).__name__}: {exc}")
            failed.append(name)
            continue
        path = write_result(result, quick, time.monotonic() - t0)
        console.print(f"{name}: {time.monotonic() - t0:.0f} s -> {path}")
    print(write_summary(), flush=True)
    console.print(f"total {time.monotonic() - started:.0f} s")
    if failed:
        console.print(f"[red]failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
