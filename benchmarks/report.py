"""The Markdown summary of the latest results: one table, every row a ratio with its target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.harness import results_dir

ORDER = ("e2e", "batch_ingest", "scoring", "decision_log", "ope", "rss", "capacity")


def _fmt(value: float) -> str:
    if value != value:  # NaN
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _cell(spread: dict[str, Any]) -> str:
    if len(spread["runs"]) < 2:
        return _fmt(spread["median"])
    return f"{_fmt(spread['median'])} ({_fmt(spread['min'])}-{_fmt(spread['max'])})"


def _verdict(target: dict[str, Any] | None) -> str:
    if not target:
        return ""
    word = "pass" if target["pass"] else "**miss**"
    if target["at_least"]:
        return f"{target['text']}: {word} ({target['margin_pct']:+.0f}%)"
    factor = target["value"] / target["threshold"]
    return f"{target['text']}: {word} ({factor:.2f}x the limit)"


def load(directory: Path | None = None) -> list[dict[str, Any]]:
    """The latest result document of each benchmark, in report order."""
    directory = directory or results_dir()
    docs = {}
    for path in sorted(directory.glob("*.json")):
        doc = json.loads(path.read_text())
        if "benchmark" in doc and "rows" in doc:
            docs[doc["benchmark"]] = doc
    return [docs[n] for n in ORDER if n in docs] + [
        d for n, d in sorted(docs.items()) if n not in ORDER
    ]


def markdown(docs: list[dict[str, Any]]) -> str:
    """The summary table (medians, min-max in brackets) plus the machine it ran on."""
    lines = [
        "| benchmark | metric | unit | Understudy | raw limit | ratio | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for doc in docs:
        tag = doc["benchmark"] + (" (quick)" if doc.get("quick") else "")
        for row in doc["rows"]:
            lines.append(
                f"| {tag} | {row['metric']} | {row['unit']} | {_cell(row['figure'])} | "
                f"{_cell(row['raw_limit'])} ({row['raw_name']}) | {_cell(row['ratio'])} | "
                f"{_verdict(row['target'])} |"
            )
    if docs:
        m = docs[-1]["machine"]
        libs = ", ".join(f"{k} {v}" for k, v in m["libraries"].items() if v)
        lines += [
            "",
            f"Machine: {m['cpu_model']}, {m['cores']} cores, Python {m['python']}, "
            f"load average {m['load_average_1m']:.1f} at the end; {libs}.",
            "Ratios are Understudy / raw limit per run (for latencies and CPU per request "
            "above 1 means slower). Medians, min-max over runs in brackets.",
        ]
    return "\n".join(lines) + "\n"


def write_summary(directory: Path | None = None) -> str:
    """Write ``summary.md`` beside the results and return it."""
    directory = directory or results_dir()
    text = "# Benchmark summary\n\n" + markdown(load(directory))
    (directory / "summary.md").write_text(text)
    return text
