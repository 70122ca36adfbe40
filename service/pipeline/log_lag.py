"""How far the decision log is behind the journal, in requests and in seconds.

`understudy_db_lag_records` counts journal records after the scorer's
checkpoint; since batching (issue 24) a record is one request or a whole batch's
accepted rows (up to 1,024), so a record count means something different per
client. `LogLag` gives the two readings that do not depend on how clients
batch: the requests (and outcome reports) in those records, and the age of the
oldest of them.

It reads the journal like a second, passive consumer that never commits: each
record after the checkpoint is read once (from the journal's in-memory tail
when recent, else from its segment files) and remembered as (seq, cumulative
rows, appended_at) in three flat arrays, about 24 bytes a record; what the
checkpoint passed is forgotten at the next reading. A batch record's rows come
from its 24-byte header (`batch_record.row_count`). The cost is paid on a
metrics scrape, off the ack path, and only for records not yet logged: ~1 us a
reading when nothing is new; ~1.5-2.5 us a record still in the tail cache (64 MB
by default); from the segment files, when the log is further behind than that
(after a restart, say), ~11 us a 3 KB record and 180-340 us a 225 KB batch
record, the payload being read whole, as the scorer reads it (/tmp timing of
20,000 and 2,000 records, journal fsync never).
"""

from __future__ import annotations

import threading
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable

from service.pipeline.batch_record import BATCH_KINDS, BatchRecordCorrupt, row_count
from service.pipeline.journal import IngestJournal, JournalError
from service.pipeline.journal_format import JournalRecord

READ_CHUNK = 4096
"""Records per journal read while catching up (bounds the memory of one read)."""


def rows_of(record: JournalRecord) -> int:
    """Requests (or outcomes) one record carries: a batch record's accepted rows, else 1."""
    if record.kind in BATCH_KINDS:
        try:
            return row_count(record.payload)
        except BatchRecordCorrupt:  # the scorer dead-letters it; it still holds something
            return 1
    return 1


class LogLag:
    """Requests in, and age of, journal records `consumer` has not committed yet.

    Thread-safe (a scrape may run on any thread); `journal` is only read.
    """

    def __init__(
        self,
        journal: IngestJournal,
        consumer: str = "scorer",
        clock: Callable[[], float] = time.time,  # the journal stamps records with time.time
    ) -> None:
        self._journal, self._consumer, self._clock = journal, consumer, clock
        self._lock = threading.Lock()
        self._seqs = array("q")  # seq of each remembered record, increasing
        self._cum = array("q")  # rows of every record counted, up to and including this one
        self._at = array("d")  # its appended_at
        self._start = 0  # index of the first remembered record after the checkpoint
        self._forgotten = 0  # rows of the records dropped from the arrays' front
        self._total = 0  # rows of every record counted
        self._seen = 0  # the last seq counted

    def requests(self) -> int:
        """Requests (and outcome reports) journaled and not yet in the decision log."""
        with self._lock:
            self._refresh_locked()
            return self._total - self._rows_before_locked(self._start)

    def oldest_age_s(self) -> float:
        """Seconds since the oldest record not yet in the decision log was journaled (0: none)."""
        with self._lock:
            self._refresh_locked()
            if self._start >= len(self._seqs):
                return 0.0
            return max(0.0, self._clock() - self._at[self._start])

    def _rows_before_locked(self, index: int) -> int:
        return self._cum[index - 1] if index > 0 else self._forgotten

    def _refresh_locked(self) -> None:
        """Forget what the checkpoint passed; count the records appended since last time."""
        journal = self._journal
        try:
            checkpoint = journal.checkpoint(self._consumer)
            head = journal.head_seq
            self._start = bisect_right(self._seqs, checkpoint, lo=self._start)
            after = max(self._seen, checkpoint)
            while after < head:
                records = journal.read(self._consumer, READ_CHUNK, after_seq=after)
                if not records:
                    break
                for record in records:
                    self._total += rows_of(record)
                    self._seqs.append(record.seq)
                    self._cum.append(self._total)
                    self._at.append(record.appended_at)
                after = records[-1].seq
            self._seen = after
        except JournalError:  # closed (a scrape during shutdown): keep the last reading
            return
        self._compact_locked()

    def _compact_locked(self) -> None:
        """Drop the forgotten front of the arrays once it is most of them."""
        start = self._start
        if start < READ_CHUNK or 2 * start < len(self._seqs):
            return
        self._forgotten = self._cum[start - 1]
        del self._seqs[:start], self._cum[:start], self._at[:start]
        self._start = 0
