"""Readiness rounds: a hung check is bounded, not called again, and holds up nobody.

The checks here are real callables on real threads; the hung one waits on an
event the test sets at the end, standing in for a database that does not
answer. Nothing is timed: the assertions are about what each round says.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from service.readiness import NOT_EVALUATED, Readiness


@pytest.fixture()
def released() -> Iterator[threading.Event]:
    """Set at the end, so a hung check's thread ends with the test."""
    event = threading.Event()
    yield event
    event.set()


def test_a_hung_check_fails_within_its_bound_and_is_not_called_again(
    released: threading.Event,
) -> None:
    calls = [0]

    def hung() -> tuple[bool, str]:
        calls[0] += 1
        released.wait()
        return True, "late"

    readiness = Readiness(timeout_s=0.2)
    # The checks that answer get a bound no busy box reaches: only the hung one may time out.
    readiness.register("fast", lambda: (True, "ok"), timeout_s=30.0)
    readiness.register("database", hung)
    assert [r.detail for r in readiness.snapshot()] == [NOT_EVALUATED] * 2
    assert not readiness.ready()
    for _ in range(3):  # three rounds while it hangs: one call, three failures
        fast, database = readiness.evaluate()
        assert (fast.ok, fast.detail) == (True, "ok")
        assert not database.ok and not database.answered
        assert database.detail.startswith("no answer within 0.2 s")
    assert calls[0] == 1, "a hung check is not called again while it hangs"
    released.set()
    readiness.next_round().result(timeout=30)  # hang guard
    readiness.stop()
    assert calls[0] >= 1


def test_readers_never_wait_and_next_round_sees_a_change(released: threading.Event) -> None:
    state = {"ok": True}
    readiness = Readiness(timeout_s=0.2)
    readiness.register("flag", lambda: (state["ok"], "flag"), timeout_s=30.0)
    readiness.register("hung", lambda: (released.wait(), "late"))
    seen: list[bool] = []
    readiness.subscribe(lambda results: seen.append(results[0].ok))
    try:
        first = readiness.next_round().result(timeout=30)
        assert first[0].ok and not first[1].answered
        state["ok"] = False
        after = readiness.next_round().result(timeout=30)  # a round started after the change
        assert not after[0].ok
        assert readiness.snapshot()[0].ok is False  # the snapshot is that round
        assert seen and seen[-1] is False, "listeners saw the round"
    finally:
        readiness.stop()
    stopped = readiness.next_round()  # after stop: answered at once from the last round
    assert stopped.done() and not stopped.result()[0].ok


def test_a_check_that_raises_reads_failed_with_the_error() -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    readiness = Readiness()
    readiness.register("broken", broken)
    (result,) = readiness.evaluate()
    assert (result.ok, result.answered) == (False, True)
    assert result.detail == "check raised RuntimeError: boom"
    with pytest.raises(ValueError, match="timeout_s"):
        readiness.register("bad", broken, timeout_s=0)
