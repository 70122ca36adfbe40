"""Writes ``confseq_reference.json``: confseq's betting sequence on seeded inputs.

Run where the `confseq` package (PyPI, 0.0.11) is installed; it needs Boost
headers and a pybind11 newer than its pinned 2.6 to build on Python 3.11::

    apt-get install libboost-dev
    python -m venv /tmp/cs && /tmp/cs/bin/pip install setuptools wheel "pybind11>=2.11" \
        cmake scikit-build numpy scipy && /tmp/cs/bin/pip install --no-build-isolation confseq
    /tmp/cs/bin/pip install "numpy<2"   # confseq 0.0.11 uses np.float_
    /tmp/cs/bin/python tests/ope/confseq_reference.py

The JSON holds the inputs and confseq's lower and upper bounds at every t, so
``test_confseq_crosscheck.py`` compares without confseq installed. Only
numpy and confseq are imported (not this project).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from confseq.betting import betting_cs

OUT = Path(__file__).with_name("confseq_reference.json")
ALPHA = 0.05
BREAKS = 1000


def main() -> None:
    rng = np.random.default_rng(20270)
    cases = {
        "beta(2,5)": rng.beta(2, 5, size=400),
        "bernoulli(0.9)": (rng.random(400) < 0.9).astype(float),
        "uniform": rng.random(400),
    }
    out = {}
    for name, x in cases.items():
        lower, upper = betting_cs(x, alpha=ALPHA, breaks=BREAKS)
        out[name] = {"x": x.tolist(), "lower": list(lower), "upper": list(upper)}
    OUT.write_text(json.dumps({"alpha": ALPHA, "breaks": BREAKS, "cases": out}) + "\n")


if __name__ == "__main__":
    main()
