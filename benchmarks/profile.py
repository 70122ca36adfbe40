"""Where the service's time goes: py-spy on the real service under a fixed open-loop load.

``python -m benchmarks.profile --transport stream --rate 1000 --seconds 15``
starts the Understudy target (3 ONNX + 3 baselines, full logging), drives it
from the load generator on its own core, and samples the server process with
``py-spy record --gil --format raw`` (only the thread holding the GIL: where
the interpreter's one core of Python goes). Stacks are classified by thread role (ingest,
scorer, HTTP loop, other) from their frames, and the inclusive share of the
heaviest functions in each role is printed and written to
``benchmarks/results/profile-<transport>.json`` (the SVG flame graph beside it).
Needs ``py-spy`` (dev dependency); py-spy needs ptrace rights over the child.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import threading
from collections import Counter
from pathlib import Path

from benchmarks.e2e import Generator, Server
from benchmarks.harness import results_dir

ROLES = (
    ("scorer", ("pipeline/scorer.py",)),
    ("ingest", ("transport/grpc/servicer.py", "pipeline/ingest.py")),
    ("http", ("uvicorn", "starlette", "fastapi")),
    ("evaluator", ("evaluator/loop.py",)),
)
_LINE = re.compile(r":\d+\)")


def role(frames: list[str]) -> str:
    """The thread role a stack belongs to, from the files on it."""
    joined = ";".join(frames)
    for name, markers in ROLES:
        if any(m in joined for m in markers):
            return name
    return "other"


def summarise(raw: str, top: int = 25) -> dict[str, object]:
    """Sample shares per role and the heaviest functions (inclusive) per role."""
    per_role: Counter[str] = Counter()
    inclusive: dict[str, Counter[str]] = {}
    leaf: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_LINE.sub(")", f) for f in stack.split(";")]
        r = role(frames)
        per_role[r] += n
        total += n
        leaf[frames[-1]] += n
        counter = inclusive.setdefault(r, Counter())
        for f in set(frames):
            counter[f] += n
    return {
        "samples": total,
        "roles": {r: n / max(total, 1) for r, n in per_role.most_common()},
        "top": {
            r: [(f, n / max(total, 1)) for f, n in c.most_common(top)] for r, c in inclusive.items()
        },
        "self": [(f, n / max(total, 1)) for f, n in leaf.most_common(top)],
    }


def main() -> None:
    """Run the load, record, summarise."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--transport", default="stream", choices=["stream", "unary", "http"])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(__file__).resolve().parents[1] / ".venv/bin/py-spy")
    out = results_dir()
    home = Path(tempfile.mkdtemp(prefix="us-bench-prof-"))
    gen = Generator()
    server = Server("understudy", args.transport, home)
    try:
        raw_path = home / "stacks.txt"
        record = [
            spy,
            "record",
            "--pid",
            str(server.pid),
            "--duration",
            str(int(args.seconds)),
            "--rate",
            "200",
            "--nonblocking",
            "--gil",
        ]
        flame = subprocess.Popen(
            [*record, "--format", "flamegraph", "-o", str(out / f"profile-{args.transport}.svg")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        stacks = subprocess.Popen(
            [*record, "--format", "raw", "-o", str(raw_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        load: dict[str, object] = {}
        worker = threading.Thread(
            target=lambda: load.update(
                gen.run(args.transport, server.port, "open", args.seconds, args.rate)
            )
        )
        worker.start()
        worker.join()
        flame.wait(60)
        stacks.wait(60)
        summary = summarise(raw_path.read_text() if raw_path.exists() else "")
        summary["load"] = load
        summary["transport"] = args.transport
        summary["rate"] = args.rate
    finally:
        server.stop()
        gen.stop()
        shutil.rmtree(home, ignore_errors=True)
    (out / f"profile-{args.transport}.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: summary[k] for k in ("samples", "roles")}, indent=2))
    for r, items in [*summary["top"].items(), ("self time", summary["self"])]:  # type: ignore[union-attr]
        print(f"\n== {r}")
        for f, share in items:
            print(f"{share:6.1%}  {f}")


if __name__ == "__main__":
    main()
