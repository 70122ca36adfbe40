"""Keep every core busy for a bounded time: the load behind ``make test-busy``.

Why: a test that races the clock passes on an idle machine and fails on a
busy CI runner. ``tools/test_busy.sh`` starts this hog beside pytest so such
a test fails here first. One spinning worker process per core (or
``--workers``), so pytest competes for every core.

Bounded three ways, so a hog can never outlive its run:

- ``--max-seconds`` (default 3600): every worker stops by itself;
- SIGTERM/SIGINT to the hog stops its workers (the script's ``trap EXIT``
  sends it, on success, failure or Ctrl-C);
- a worker whose parent is gone (the hog was SIGKILLed) stops within a second.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import time


def spin(until: float, parent: int) -> None:
    """Burn one core until `until` (monotonic) or until `parent` is gone."""
    x = 0
    while True:
        for _ in range(200_000):
            x = (x * 1_103_515_245 + 12_345) & 0xFFFF_FFFF
        now = time.monotonic()
        if now >= until or os.getppid() != parent:
            return


def main(argv: list[str] | None = None) -> int:
    """Start the workers, wait for them (or a signal), stop them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    args = parser.parse_args(argv)
    until = time.monotonic() + args.max_seconds
    workers = [
        mp.Process(target=spin, args=(until, os.getpid()), daemon=True) for _ in range(args.workers)
    ]
    for w in workers:
        w.start()

    def stop(signum: int, _frame: object) -> None:
        for w in workers:
            w.terminate()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        f"cpu_hog: {args.workers} workers, pid {os.getpid()}, at most {args.max_seconds:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    for w in workers:
        w.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
