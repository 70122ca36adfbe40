"""The wait/wake part that `Lane` and `Batcher` share: one condition guards a buffer.

Both are pure bookkeeping under one lock: the caller's `offer` appends and
notifies, the sender thread waits on the same condition for work, `flush`
waits on it until the buffer is empty, and `close` wakes every waiter. What
"empty" means differs (a lane holds messages; a batcher also counts the
requests its sender is building into a batch), so each says it in `_busy`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Guarded:
    """A buffer guarded by one `threading.Condition` that senders and flushers wait on."""

    def __init__(self) -> None:
        self._cond = threading.Condition()

    def _busy(self) -> bool:
        """Under the lock: whether anything is held that `wait_empty` must wait for."""
        raise NotImplementedError

    def wait_empty(self, timeout: float) -> bool:
        """Block until nothing is held (`_busy` is false); False if `timeout` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy(), timeout)

    def wake(self) -> None:
        """Wake every thread waiting on this buffer (used at shutdown)."""
        with self._cond:
            self._cond.notify_all()

    def locked(self, fn: Callable[[], Any]) -> Any:
        """`fn()` under this buffer's lock (a consistent read across it and another)."""
        with self._cond:
            return fn()
