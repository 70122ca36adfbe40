"""The journal on a full disk: refused appends leave it whole, and it heals by itself.

The first tests run the journal on a real 1 MiB tmpfs (tests/tinyfs.py; skipped,
saying so, where a tmpfs cannot be mounted): ENOSPC there is the kernel's, with
its partial writes. The last two inject failures by monkeypatching ``os`` calls
(said in their names): a rollback that fails and a segment that cannot be
created, which no real filesystem produces on demand.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from service.contract import MirrorRequest, RequestLimits
from service.metrics import ServiceMetrics
from service.pipeline.ingest import AckStatus, Ingest
from service.pipeline.journal import (
    FsyncMode,
    IngestJournal,
    JournalConfig,
    JournalIOError,
    RecordKind,
    read_all,
)
from service.pipeline.journal_format import HEADER_SIZE
from service.wire.convert import mirror_request_to_pb
from tests.tinyfs import fill, tmpfs

MIRROR = RecordKind.MIRROR
RECORD = 5000
"""Payload bytes of one record: a 1 MiB disk holds ~200."""


@pytest.fixture()
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB filesystem of its own."""
    with tmpfs(tmp_path / "disk", "1m") as mounted:
        yield mounted


def body(i: int) -> bytes:
    return (b"%08d" % i) * (RECORD // 8)


def open_journal(directory: Path, segment_bytes: int) -> IngestJournal:
    config = JournalConfig(
        directory,
        segment_bytes=segment_bytes,
        max_bytes=1 << 30,  # far above the disk: the disk is the limit here
        fsync_mode=FsyncMode.NEVER,
    )
    return IngestJournal(config)


def append_until_full(journal: IngestJournal) -> tuple[list[int], JournalIOError]:
    seqs: list[int] = []
    for i in range(10_000):  # a hang guard: 1 MiB holds ~200
        try:
            seq = journal.append(MIRROR, body(i))
        except JournalIOError as exc:
            return seqs, exc
        assert seq is not None
        seqs.append(seq)
    raise AssertionError("a 1 MiB disk never filled")


def test_enospc_mid_append_leaves_whole_records_and_a_clean_reopen(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = disk / "journal"
    journal = open_journal(directory, segment_bytes=4 << 20)  # one segment: the tail matters
    seqs, exc = append_until_full(journal)
    assert exc.errno == errno.ENOSPC and exc.reason == "no space left on device"
    assert str(disk) not in exc.reason
    (segment,) = directory.glob("*.seg")
    # the refused record (a partial write the kernel took in part) was cut off again
    assert segment.stat().st_size == len(seqs) * (HEADER_SIZE + RECORD)
    assert journal.health() == (False, "write failed: no space left on device, 1 refused")
    with pytest.raises(JournalIOError):
        journal.append(MIRROR, body(-1))
    assert journal.health()[1].endswith(", 2 refused")

    assert [r.seq for r in journal.read("scorer", 10_000)] == seqs
    journal.close()
    with caplog.at_level(logging.WARNING, logger="service.pipeline.journal"):
        reopened = open_journal(directory, segment_bytes=4 << 20)
    assert "torn tail" not in caplog.text, "a refused write left a partial record behind"
    assert [r.payload for r in read_all(directory)] == [body(i) for i in range(len(seqs))]
    assert reopened.head_seq == len(seqs)
    reopened.close()


def test_space_freed_elsewhere_is_used_by_the_next_append(disk: Path) -> None:
    journal = open_journal(disk / "journal", segment_bytes=64 << 10)
    for i in range(20):
        assert journal.append(MIRROR, body(i)) is not None
    filler = fill(disk)
    with pytest.raises(JournalIOError):
        journal.append(MIRROR, body(20))
    assert not journal.health()[0]
    filler.unlink()
    assert journal.append(MIRROR, body(21)) == 21  # at once: nothing latched
    assert journal.health()[0]
    assert [r.payload for r in journal.read("scorer", 100)] == [body(i) for i in range(20)] + [
        body(21)
    ]
    journal.close()


def test_a_disk_the_journal_filled_itself_frees_up_once_the_consumer_commits(
    disk: Path,
) -> None:
    """The issue's 40 s: consumed segments outlived the drain on the disk they filled.

    The checkpoint itself needs a page; on a full disk its write failed and no
    segment was deleted, and the active segment (consumed, but never deleted
    until it rotates) kept its space. Now the commit frees what it passes first,
    and the next append replaces a wholly consumed active segment.
    """
    directory = disk / "journal"
    journal = open_journal(directory, segment_bytes=128 << 10)
    seqs, _ = append_until_full(journal)
    journal.commit("scorer", seqs[-1])  # raised ENOSPC before: the disk stayed full
    assert journal.checkpoint("scorer") == seqs[-1]
    seq = journal.append(MIRROR, body(0))
    assert seq == seqs[-1] + 1
    assert journal.health()[0]
    assert [r.seq for r in journal.read("scorer", 10)] == [seq]
    journal.close()
    reopened = open_journal(directory, segment_bytes=128 << 10)
    assert reopened.checkpoint("scorer") == seqs[-1]
    assert [r.seq for r in reopened.read("scorer", 10)] == [seq]
    reopened.close()


def test_a_disk_full_while_unconsumed_stays_refused_then_the_commit_reclaims(
    disk: Path,
) -> None:
    """Unconsumed records are never deleted; checkpoints still move on a disk with no block.

    One segment holds everything, so no commit short of the last frees a byte:
    each checkpoint then has to be written where no new block can be had (in
    place), or the consumer could never get to the last one.
    """
    directory = disk / "journal"
    journal = open_journal(directory, segment_bytes=2 << 20)  # everything in the active one
    assert journal.append(MIRROR, body(0)) == 1
    journal.commit("scorer", 1)  # a consumer that has checkpointed before
    seqs, _ = append_until_full(journal)
    fill(disk, "topoff")  # no block left at all, not even for a checkpoint
    with pytest.raises(JournalIOError):
        journal.append(MIRROR, body(0))
    assert len(read_all(directory)) == len(seqs) + 1, "unconsumed records must stay"
    for upto in seqs[::10]:  # a consumer's batches, each checkpointed on the full disk
        journal.commit("scorer", upto)
        assert journal.checkpoint("scorer") == upto
        with pytest.raises(JournalIOError):
            journal.append(MIRROR, body(0))
    journal.commit("scorer", seqs[-1])
    assert journal.append(MIRROR, body(0)) == seqs[-1] + 1
    journal.close()
    reopened = open_journal(directory, segment_bytes=2 << 20)
    assert reopened.checkpoint("scorer") == seqs[-1]
    reopened.close()


def test_a_failed_rollback_is_retried_before_the_next_write_monkeypatched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Injected: writev writes half a record then ENOSPC; the cut back fails once."""
    journal = open_journal(tmp_path / "journal", segment_bytes=1 << 20)
    assert journal.append(MIRROR, body(0)) == 1
    real_writev, real_ftruncate = os.writev, os.ftruncate
    cuts = {"fail": 1}

    def half_writev(fd: int, bufs: list[bytes]) -> int:
        os.write(fd, b"".join(bufs)[: RECORD // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    def flaky_ftruncate(fd: int, length: int) -> None:
        if cuts["fail"]:
            cuts["fail"] -= 1
            raise OSError(errno.EIO, "Input/output error")
        real_ftruncate(fd, length)

    monkeypatch.setattr("service.pipeline.journal_store.os.writev", half_writev)
    monkeypatch.setattr("service.pipeline.journal_store.os.ftruncate", flaky_ftruncate)
    with pytest.raises(JournalIOError):
        journal.append(MIRROR, body(1))
    assert journal.health() == (False, "write failed: no space left on device, 1 refused")
    monkeypatch.setattr("service.pipeline.journal_store.os.writev", real_writev)
    assert journal.append(MIRROR, body(2)) == 2  # the partial record was cut first
    assert journal.health()[0]
    journal.close()
    assert [r.payload for r in read_all(tmp_path / "journal")] == [body(0), body(2)]


def test_a_segment_that_cannot_be_created_leaves_the_old_one_active_monkeypatched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Injected: creating the next segment fails (EMFILE, say); the journal is unchanged."""
    directory = tmp_path / "journal"
    journal = open_journal(directory, segment_bytes=3 * (HEADER_SIZE + RECORD))
    for i in range(3):
        assert journal.append(MIRROR, body(i)) == i + 1
    real_open = os.open

    def no_new_files(path: str | Path, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_CREAT:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode)

    monkeypatch.setattr("service.pipeline.journal_store.os.open", no_new_files)
    with pytest.raises(JournalIOError) as refused:
        journal.append(MIRROR, body(3))  # needs a new segment
    assert refused.value.errno == errno.EMFILE
    assert journal.health() == (False, "write failed: too many open files, 1 refused")
    monkeypatch.setattr("service.pipeline.journal_store.os.open", real_open)
    assert journal.append(MIRROR, body(4)) == 4
    journal.close()
    assert [r.payload for r in read_all(directory)] == [body(i) for i in (0, 1, 2, 4)]
    assert len(list(directory.glob("*.seg"))) == 2


def test_a_consumer_that_never_committed_can_still_commit_on_a_full_disk(disk: Path) -> None:
    """A new service whose database was down from the start: the journal fills the disk."""
    directory = disk / "journal"
    journal = open_journal(directory, segment_bytes=2 << 20)
    seqs, _ = append_until_full(journal)
    fill(disk, "topoff")
    journal.commit("scorer", seqs[5])  # no block to spare: rewritten in place
    assert journal.checkpoint("scorer") == seqs[5]
    journal.commit("scorer", seqs[-1])
    assert journal.append(MIRROR, body(0)) == seqs[-1] + 1
    journal.close()


def test_ingest_sheds_by_reason_bound_then_disk(
    disk: Path, requests_sample: list[MirrorRequest]
) -> None:
    """Ingest turns a full bound and a full disk into sheds, each counted by its reason."""
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry)
    request = requests_sample[0]
    raw = mirror_request_to_pb(request).SerializeToString()
    config = JournalConfig(
        disk / "journal", max_bytes=3 * (HEADER_SIZE + len(raw)), fsync_mode=FsyncMode.NEVER
    )
    journal = IngestJournal(config)
    ingest = Ingest(journal, metrics, RequestLimits())
    sent = itertools.count()

    def mirror() -> AckStatus:  # a new id each time (a re-sent one is not journaled again);
        # the journaled bytes stay the first request's: only their size matters here
        fresh = dataclasses.replace(request, request_id=f"disk-{next(sent)}")
        return ingest.mirror("grpc", lambda: (fresh, raw)).status

    def count(result: str, reason: str | None = None) -> float:
        if reason is None:
            labels = {"transport": "grpc", "kind": "mirror", "result": result}
            return registry.get_sample_value("understudy_ingest_total", labels) or 0.0
        labels = {"transport": "grpc", "kind": "mirror", "reason": reason}
        return registry.get_sample_value("understudy_ingest_sheds_total", labels) or 0.0

    assert [mirror() for _ in range(4)] == [AckStatus.ACCEPTED] * 3 + [AckStatus.SHED]
    assert count("shed", "journal_full") == 1
    journal.commit("scorer", 2)  # room under the bound; seq 3 keeps the segment in use
    filler = fill(disk)
    assert mirror() is AckStatus.SHED  # the disk, not the bound
    assert count("shed", "disk_full") == 1 and count("shed") == 2 and count("accepted") == 3
    filler.unlink()
    assert mirror() is AckStatus.ACCEPTED
    journal.close()
    assert mirror() is AckStatus.SHED  # closed (shutting down): shed, not an internal error
    assert count("shed", "journal_error") == 1


def test_a_failed_background_fsync_is_shown_and_retried_monkeypatched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Injected: fsync fails (EIO) once; readiness says so and the next pass syncs it again."""
    config = JournalConfig(
        tmp_path / "journal",
        segment_bytes=HEADER_SIZE + RECORD,  # one record a segment: the next one rotates
        fsync_mode=FsyncMode.INTERVAL,
        fsync_interval_s=3600.0,  # the test runs the passes itself: none races with it
    )
    journal = IngestJournal(config)
    synced: list[Path] = []
    failing = {"left": 1}

    def flaky_fsync(path: Path) -> None:
        if failing["left"]:
            failing["left"] -= 1
            raise OSError(errno.EIO, "Input/output error")
        synced.append(path)

    monkeypatch.setattr("service.pipeline.journal.fsync_path", flaky_fsync)
    assert journal.append(MIRROR, body(0)) == 1
    with pytest.raises(JournalIOError):
        journal.sync()
    assert journal.health() == (False, "fsync failed: input/output error")
    assert journal.append(MIRROR, body(1)) == 2  # appends go on meanwhile (a new segment)
    journal.sync()
    first, second = sorted((tmp_path / "journal").glob("*.seg"))
    assert sorted(synced) == [first, second]  # the first one again: the failed pass had it
    assert journal.health()[0]
    journal.close()
