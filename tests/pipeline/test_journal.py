"""The ingest journal keeps what ingest acked: across restarts, crashes, rotation and bound.

Every test uses real files under tmp_path; the crash test SIGKILLs a real child
process that journals and prints each acked seq.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import service.pipeline.journal as journal_module
from service.pipeline.journal import (
    FsyncMode,
    IngestJournal,
    JournalClosed,
    JournalConfig,
    JournalCorrupt,
    JournalLocked,
    JournalRecord,
    RecordKind,
    read_all,
)
from service.pipeline.journal_format import HEADER, HEADER_SIZE
from service.pipeline.journal_store import SegmentStore

MIRROR = RecordKind.MIRROR
OUTCOME = RecordKind.OUTCOME


def cfg(directory: Path, **kw: object) -> JournalConfig:
    kw.setdefault("fsync_mode", FsyncMode.NEVER)
    return JournalConfig(directory, **kw)  # type: ignore[arg-type]


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.seg"))


def payload(i: int, pad: int = 0) -> bytes:
    return b"rec-%d-" % i + b"x" * pad


# ---------------------------------------------------------------- basics


def test_append_read_roundtrip_and_seq_monotonic_across_reopen(tmp_path: Path) -> None:
    with IngestJournal(cfg(tmp_path)) as j:
        seqs = [j.append(MIRROR if i % 2 else OUTCOME, payload(i)) for i in range(1, 11)]
        assert seqs == list(range(1, 11))
        got = j.read("scorer", 100)
        assert [r.seq for r in got] == seqs
        assert [r.payload for r in got] == [payload(i) for i in range(1, 11)]
        assert got[0].kind is MIRROR and got[1].kind is OUTCOME
        assert all(isinstance(r, JournalRecord) for r in got)
        assert got[0].appended_at <= got[-1].appended_at <= time.time()
        assert j.head_seq == 10
    with IngestJournal(cfg(tmp_path)) as j:
        assert j.head_seq == 10
        assert j.append(MIRROR, b"after") == 11
        # after a restart the cache is cold: old records come from the segment file
        got = j.read("scorer", 100)
        assert [r.seq for r in got] == list(range(1, 12))
        assert got[-1].payload == b"after"
        assert got[3].payload == payload(4)
        assert j.read("scorer", 3, after_seq=9) == got[9:]


def test_read_limits_and_after_seq(tmp_path: Path) -> None:
    with IngestJournal(cfg(tmp_path, tail_cache_bytes=0)) as j:
        for i in range(50):
            j.append(MIRROR, payload(i))
        assert [r.seq for r in j.read("scorer", 7)] == list(range(1, 8))
        assert [r.seq for r in j.read("scorer", 7, after_seq=45)] == [46, 47, 48, 49, 50]
        assert j.read("scorer", 7, after_seq=50) == []
        assert j.read("scorer", 0) == []
        with pytest.raises(KeyError):
            j.read("nobody", 1)


def test_concurrent_appenders_keep_per_thread_order_without_gaps(tmp_path: Path) -> None:
    threads, per_thread = 8, 2000
    with IngestJournal(cfg(tmp_path, segment_bytes=256 * 1024)) as j:
        barrier = threading.Barrier(threads)
        errors: list[BaseException] = []

        def work(t: int) -> None:
            try:
                barrier.wait()
                for i in range(per_thread):
                    body = f"{t}:{i}".encode()
                    if i % 10 == 0:  # mix in stream batches
                        out = j.append_many([(MIRROR, body)])
                        assert out[0] is not None
                    else:
                        assert j.append(MIRROR, body) is not None
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not errors
        records = j.read("scorer", threads * per_thread + 10)
    assert [r.seq for r in records] == list(range(1, threads * per_thread + 1))
    last = [-1] * threads
    for r in records:
        t, i = map(int, r.payload.split(b":"))
        assert i == last[t] + 1, "a thread's records must appear in its own order"
        last[t] = i
    assert last == [per_thread - 1] * threads
    # the files agree with what readers saw, after a reopen
    assert [(r.seq, r.payload) for r in read_all(tmp_path)] == [(r.seq, r.payload) for r in records]


# ---------------------------------------------------------------- checkpoints


def test_checkpoint_commit_and_resume_after_reopen(tmp_path: Path) -> None:
    with IngestJournal(cfg(tmp_path)) as j:
        for i in range(20):
            j.append(MIRROR, payload(i))
        batch = j.read("scorer", 8)
        j.commit("scorer", batch[-1].seq)
        assert j.checkpoint("scorer") == 8
        assert j.depth_records() == 12
        with pytest.raises(ValueError):
            j.commit("scorer", 3)  # backwards
        with pytest.raises(ValueError):
            j.commit("scorer", 21)  # beyond head
        j.commit("scorer", 8)  # idempotent
    assert (tmp_path / "checkpoints" / "scorer").exists()
    with IngestJournal(cfg(tmp_path)) as j:
        assert j.checkpoint("scorer") == 8
        nxt = j.read("scorer", 5)
        assert [r.seq for r in nxt] == [9, 10, 11, 12, 13]
        assert nxt[0].payload == payload(8)
        assert j.depth_records("scorer") == 12


def test_two_consumers_segment_deleted_only_when_both_passed(tmp_path: Path) -> None:
    config = cfg(tmp_path, segment_bytes=300)
    with IngestJournal(config, consumers=("scorer", "audit")) as j:
        for i in range(30):
            j.append(MIRROR, payload(i, 40))
        first = segments(tmp_path)
        assert len(first) > 5
        j.commit("scorer", 30)
        assert segments(tmp_path) == first, "audit has not passed them yet"
        j.commit("audit", 10)
        left = segments(tmp_path)
        assert first[0] not in left and len(left) < len(first)
        assert read_all(tmp_path)[0].seq <= 11, "audit's next record must be kept"
        assert [r.seq for r in j.read("audit", 100)] == list(range(11, 31))
        j.commit("audit", 30)
        assert len(segments(tmp_path)) == 1, "only the active segment remains"
        assert j.depth_bytes == 0
    with IngestJournal(config, consumers=("scorer", "audit")) as j:
        assert j.head_seq == 30
        assert j.read("audit", 10) == []
        assert j.append(MIRROR, b"next") == 31


def test_rotation_and_read_across_segments_after_reopen(tmp_path: Path) -> None:
    config = cfg(tmp_path, segment_bytes=200)
    with IngestJournal(config) as j:
        for i in range(40):
            assert j.append(OUTCOME, payload(i, i % 50)) == i + 1
    segs = segments(tmp_path)
    assert len(segs) > 10
    for seg in segs:  # named by their first seq, and the name matches the content
        assert int(seg.stem) == read_all_first_seq(seg)
        assert seg.stat().st_size <= 200
    with IngestJournal(config) as j:
        got = j.read("scorer", 1000)
        assert [r.payload for r in got] == [payload(i, i % 50) for i in range(40)]
        assert [r.seq for r in j.read("scorer", 4, after_seq=17)] == [18, 19, 20, 21]
        j.commit("scorer", 25)
        assert all(int(s.stem) > 20 for s in segments(tmp_path))
        assert [r.seq for r in j.read("scorer", 100)] == list(range(26, 41))


def read_all_first_seq(seg: Path) -> int:
    magic, _crc, _len, seq, _kind, _ts = HEADER.unpack_from(seg.read_bytes(), 0)
    assert magic == b"UJR1"
    return int(seq)


# ---------------------------------------------------------------- bound


def test_full_journal_sheds_and_recovers_after_commit(tmp_path: Path) -> None:
    rec = HEADER_SIZE + len(payload(0, 60))
    config = cfg(tmp_path, segment_bytes=4 * rec, max_bytes=10 * rec + rec // 2)
    attempted, accepted, shed = 50, [], 0
    with IngestJournal(config) as j:
        for i in range(attempted):
            seq = j.append(MIRROR, payload(i, 60 - len(str(i)) + 1))
            if seq is None:
                shed += 1
            else:
                accepted.append(seq)
        assert len(accepted) + shed == attempted
        assert len(accepted) == 10 and shed == 40
        assert j.stats().shed_total == 40
        assert j.depth_bytes <= j.capacity_bytes == config.max_bytes
        assert [r.seq for r in j.read("scorer", 100)] == accepted
        assert j.append(MIRROR, payload(0, 60)) is None
        assert j.append(MIRROR, b"") == 11, "a smaller record still fits the bound exactly"
        j.commit("scorer", accepted[2])
        more = [j.append(MIRROR, payload(i, 60 - len(str(i)) + 1)) for i in range(4)]
        assert more == [12, 13, 14, None]
        assert j.stats().shed_total == 42
        j.commit("scorer", 14)
        assert j.depth_bytes == 0
    with IngestJournal(config) as j:  # depth is recovered from disk, not reset
        assert j.depth_bytes == 0 and j.append(MIRROR, b"x") == 15


def test_bound_is_exact_headers_included(tmp_path: Path) -> None:
    rec = HEADER_SIZE + 20
    with IngestJournal(cfg(tmp_path, max_bytes=3 * rec)) as j:
        assert [j.append(MIRROR, b"y" * 20) for _ in range(3)] == [1, 2, 3]
        assert j.depth_bytes == j.capacity_bytes
        assert j.append(MIRROR, b"") is None, "even an empty payload has a header"
        j.commit("scorer", 1)
        assert j.append(MIRROR, b"y" * 21) is None
        assert j.append(MIRROR, b"y" * 20) == 4


def test_mutable_payload_is_copied(tmp_path: Path) -> None:
    buf = bytearray(b"original")
    with IngestJournal(cfg(tmp_path)) as j:
        j.append(MIRROR, buf)  # type: ignore[arg-type]
        j.append_many([(OUTCOME, memoryview(buf))])  # type: ignore[list-item]
        buf[:] = b"changed!"
        assert [r.payload for r in j.read("scorer", 5)] == [b"original", b"original"]


def test_readers_and_committer_race_appenders_rotation_and_fsync(tmp_path: Path) -> None:
    config = cfg(
        tmp_path,
        segment_bytes=300,
        tail_cache_bytes=400,
        fsync_mode=FsyncMode.INTERVAL,
        fsync_interval_s=0.001,
    )
    total = 3000
    with IngestJournal(config) as j:
        done = threading.Event()
        errors: list[BaseException] = []
        seen: list[int] = []

        def writer(t: int) -> None:
            try:
                for i in range(total // 3):
                    assert j.append(MIRROR, f"{t}:{i}".encode()) is not None
            except BaseException as exc:
                errors.append(exc)

        def consumer() -> None:  # reads, then commits what it read, like the scorer
            try:
                while not (done.is_set() and j.checkpoint("scorer") == j.head_seq):
                    batch = j.read("scorer", 37)
                    if batch:
                        seen.extend(r.seq for r in batch)
                        j.commit("scorer", batch[-1].seq)
                    else:
                        j.wait_for_records("scorer", 0.01)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(3)]
        reader = threading.Thread(target=consumer)
        for t in [*threads, reader]:
            t.start()
        for t in threads:
            t.join()
        done.set()
        reader.join(30)
        assert not reader.is_alive() and not errors
        assert seen == list(range(1, total + 1))
        assert j.stats().fsync_failures_total == 0 and j.depth_bytes == 0
        assert len(segments(tmp_path)) <= 2


def test_depth_bytes_recovered_exactly_after_reopen(tmp_path: Path) -> None:
    config = cfg(tmp_path, segment_bytes=500, tail_cache_bytes=0)
    sizes = [HEADER_SIZE + len(payload(i, i)) for i in range(60)]
    with IngestJournal(config) as j:
        for i in range(60):
            j.append(MIRROR, payload(i, i))
        assert j.depth_bytes == sum(sizes)
        j.commit("scorer", 33)  # located by scanning the file: the cache is off
        assert j.depth_bytes == sum(sizes[33:])
    with IngestJournal(config) as j:
        assert j.depth_bytes == sum(sizes[33:])
        assert j.depth_records() == 27


def test_append_many_keeps_order_spans_segments_and_sheds_a_suffix(tmp_path: Path) -> None:
    rec = HEADER_SIZE + 10
    config = cfg(tmp_path, segment_bytes=3 * rec, max_bytes=8 * rec)
    with IngestJournal(config) as j:
        items = [(MIRROR, b"%010d" % i) for i in range(12)]
        out = j.append_many(items)
        assert out == [1, 2, 3, 4, 5, 6, 7, 8, None, None, None, None]
        assert len(segments(tmp_path)) == 3
        assert [r.payload for r in j.read("scorer", 20)] == [p for _, p in items[:8]]
        assert j.append_many([]) == []
    with IngestJournal(config) as j:
        assert [r.payload for r in j.read("scorer", 20)] == [p for _, p in items[:8]]


# ---------------------------------------------------------------- damage


def _fill(directory: Path, n: int, **kw: object) -> None:
    with IngestJournal(cfg(directory, **kw)) as j:
        for i in range(n):
            j.append(MIRROR, payload(i, 30))


def test_torn_tail_mid_record_is_truncated_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _fill(tmp_path, 10)
    seg = segments(tmp_path)[-1]
    size = seg.stat().st_size
    os.truncate(seg, size - 7)  # the last record is torn
    with caplog.at_level(logging.WARNING), IngestJournal(cfg(tmp_path)) as j:
        assert j.head_seq == 9
        assert [r.payload for r in j.read("scorer", 100)] == [payload(i, 30) for i in range(9)]
        assert j.append(MIRROR, b"new") == 10
        assert j.read("scorer", 1, after_seq=9)[0].payload == b"new"
    assert any("torn tail" in r.getMessage() for r in caplog.records)
    assert [r.seq for r in read_all(tmp_path)] == list(range(1, 11))


@pytest.mark.parametrize("garbage", [b"\x00" * 4096, os.urandom(1000), b"UJR1" + b"\x07" * 60])
def test_garbage_after_the_tail_is_truncated(tmp_path: Path, garbage: bytes) -> None:
    _fill(tmp_path, 10)
    seg = segments(tmp_path)[-1]
    good = seg.stat().st_size
    with seg.open("ab") as f:
        f.write(garbage)
    with IngestJournal(cfg(tmp_path)) as j:
        assert seg.stat().st_size == good
        assert [r.payload for r in j.read("scorer", 100)] == [payload(i, 30) for i in range(10)]
        assert j.append(MIRROR, b"new") == 11
    assert [r.seq for r in read_all(tmp_path)] == list(range(1, 12))


def test_corrupt_record_in_a_middle_segment_raises(tmp_path: Path) -> None:
    _fill(tmp_path, 30, segment_bytes=200)
    victim = segments(tmp_path)[1]
    data = bytearray(victim.read_bytes())
    data[HEADER_SIZE + 3] ^= 0xFF  # a payload byte of its first record
    victim.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt) as info:
        IngestJournal(cfg(tmp_path, segment_bytes=200))
    assert info.value.path == victim and info.value.offset == 0
    assert str(victim) in str(info.value) and "crc" in str(info.value)
    with pytest.raises(JournalCorrupt):
        read_all(tmp_path)
    # an emptied middle segment is missing acked records, too
    victim.write_bytes(b"")
    with pytest.raises(JournalCorrupt, match="empty"):
        IngestJournal(cfg(tmp_path, segment_bytes=200))
    # a failed open neither changed the files nor kept the directory locked
    data[HEADER_SIZE + 3] ^= 0xFF
    victim.write_bytes(bytes(data))
    with IngestJournal(cfg(tmp_path, segment_bytes=200)) as j:
        assert [r.seq for r in j.read("scorer", 100)] == list(range(1, 31))


def test_damage_followed_by_valid_records_in_last_segment_is_not_truncated(
    tmp_path: Path,
) -> None:
    _fill(tmp_path, 10)
    seg = segments(tmp_path)[-1]
    data = bytearray(seg.read_bytes())
    rec = HEADER_SIZE + len(payload(0, 30))
    data[3 * rec + HEADER_SIZE] ^= 0x01  # record 4 of 10: acked records follow it
    seg.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt) as info:
        IngestJournal(cfg(tmp_path))
    assert info.value.offset == 3 * rec
    assert seg.stat().st_size == len(data), "nothing may be cut"


def test_checkpoint_ahead_of_lost_data_never_reuses_seqs(tmp_path: Path) -> None:
    # Power loss in NEVER mode can lose journal pages while the (fsynced) checkpoint
    # survives; numbering must continue above the checkpoint.
    with IngestJournal(cfg(tmp_path)) as j:
        for i in range(10):
            j.append(MIRROR, payload(i))
        j.commit("scorer", 10)
    for seg in segments(tmp_path):
        os.truncate(seg, 0)
    with IngestJournal(cfg(tmp_path)) as j:
        assert j.head_seq == 10
        assert j.append(MIRROR, b"x") == 11
        assert [r.seq for r in j.read("scorer", 5)] == [11]
    with IngestJournal(cfg(tmp_path)) as j:
        assert j.head_seq == 11


# ---------------------------------------------------------------- process crash

_CHILD = """
import sys
from pathlib import Path
from service.pipeline.journal import FsyncMode, IngestJournal, JournalConfig, RecordKind
j = IngestJournal(JournalConfig(Path(sys.argv[1]), segment_bytes=256 * 1024,
                                fsync_mode=FsyncMode.NEVER))
i = 0
while True:
    i += 1
    seq = j.append(RecordKind.MIRROR, b"rec-%d-" % i + b"x" * (i % 2000))
    sys.stdout.write(f"{seq}\\n")
    sys.stdout.flush()
"""


def test_sigkill_loses_no_acked_record(tmp_path: Path) -> None:
    root = Path(journal_module.__file__).resolve().parents[2]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)], stdout=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None
    acked: list[int] = []
    try:
        while len(acked) < 3000:  # the child acks as fast as it can; the kill waits for 3000
            line = proc.stdout.readline()
            if not line:
                break
            acked.append(int(line))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
    rest = proc.stdout.read()  # acks printed before the kill landed
    proc.stdout.close()
    assert proc.wait() == -signal.SIGKILL
    acked += [int(x) for x in rest.split(b"\n")[:-1]]  # the last piece may be half a line
    assert len(acked) >= 3000
    assert acked == list(range(1, len(acked) + 1))
    on_disk = {r.seq: r.payload for r in read_all(tmp_path)}
    for seq in acked:
        assert on_disk[seq] == b"rec-%d-" % seq + b"x" * (seq % 2000)
    with IngestJournal(cfg(tmp_path, segment_bytes=256 * 1024)) as j:
        assert j.head_seq >= acked[-1]
        assert j.append(MIRROR, b"after crash") == j.head_seq
        assert [r.seq for r in j.read("scorer", len(acked))] == acked


# ---------------------------------------------------------------- fsync, lifecycle


def test_interval_fsync_thread_runs_and_close_stops_it(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    j = IngestJournal(cfg(tmp_path, fsync_mode=FsyncMode.INTERVAL, fsync_interval_s=0.01))
    syncers = [t for t in threading.enumerate() if t.name.startswith("journal-fsync")]
    assert len(syncers) == 1 and syncers[0].is_alive()
    j.append(MIRROR, b"a")
    deadline = time.monotonic() + 120  # a hang guard: the thread syncs every 10 ms
    while j.stats().fsyncs_total == 0:
        assert time.monotonic() < deadline, "the background thread never synced (hang guard)"
        time.sleep(0.005)  # poll interval of a condition wait
    j.close()
    j.close()  # idempotent
    assert not syncers[0].is_alive()
    assert set(threading.enumerate()) == before
    with pytest.raises(JournalClosed):
        j.append(MIRROR, b"b")
    with pytest.raises(JournalClosed):
        j.read("scorer", 1)
    with IngestJournal(cfg(tmp_path)) as j2:
        assert [r.payload for r in j2.read("scorer", 5)] == [b"a"]


def test_interval_mode_fsyncs_rotated_segments_and_new_directory_entries(tmp_path: Path) -> None:
    # White-box on the store: power loss cannot be simulated here, so check that the
    # INTERVAL sync pass covers every segment written since the last pass.
    store = SegmentStore(tmp_path, 100, FsyncMode.INTERVAL)
    store.recover(0)
    for _ in range(5):
        store.append_one_locked(MIRROR, b"z" * 40, zlib.crc32(b"z" * 40), HEADER_SIZE + 40)
    paths, dir_dirty = store.sync_targets_locked()
    assert sorted(paths) == segments(tmp_path) and dir_dirty
    assert store.sync_targets_locked() == ([], False), "nothing new since the last pass"
    store.close_locked()


def test_always_and_never_modes_start_no_thread(tmp_path: Path) -> None:
    for mode in (FsyncMode.ALWAYS, FsyncMode.NEVER):
        before = set(threading.enumerate())
        with IngestJournal(cfg(tmp_path / mode.value, fsync_mode=mode, segment_bytes=100)) as j:
            assert set(threading.enumerate()) == before
            assert j.append_many([(MIRROR, b"x" * 40)] * 5) == [1, 2, 3, 4, 5]
            assert j.append(OUTCOME, b"y") == 6
            if mode is FsyncMode.ALWAYS:
                assert j.stats().fsyncs_total >= 2
            j.sync()
        assert len(read_all(tmp_path / mode.value)) == 6


def test_directory_is_locked_while_open(tmp_path: Path) -> None:
    with IngestJournal(cfg(tmp_path)), pytest.raises(JournalLocked):
        IngestJournal(cfg(tmp_path))
    with IngestJournal(cfg(tmp_path)) as j:  # released on close
        assert j.head_seq == 0


@pytest.mark.live
def test_wait_for_records_wakes_on_append_and_times_out(tmp_path: Path) -> None:
    with IngestJournal(cfg(tmp_path)) as j:
        t0 = time.monotonic()
        assert j.wait_for_records("scorer", 0.05) is False
        assert time.monotonic() - t0 >= 0.04  # it waited; load can only make this longer
        timer = threading.Timer(0.05, lambda: j.append(MIRROR, b"wake"))
        timer.start()
        t0 = time.monotonic()
        assert j.wait_for_records("scorer", 120.0) is True
        # Woken by the append, not by its 120 s timeout (only a 60 s stall could blur it).
        assert time.monotonic() - t0 < 60.0
        timer.join()
        assert j.wait_for_records("scorer", 0.01) is True  # not committed yet
        assert j.wait_for_records("scorer", 0.01, after_seq=1) is False
        j.commit("scorer", 1)
        assert j.wait_for_records("scorer", 0.01) is False


def test_config_and_consumer_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        JournalConfig(tmp_path, segment_bytes=10)
    with pytest.raises(ValueError):
        JournalConfig(tmp_path, max_bytes=0)
    with pytest.raises(ValueError):
        IngestJournal(cfg(tmp_path), consumers=("../etc",))
    with pytest.raises(ValueError):
        IngestJournal(cfg(tmp_path), consumers=())
    assert JournalConfig(tmp_path, fsync_mode="always").fsync_mode is FsyncMode.ALWAYS  # type: ignore[arg-type]


# ---------------------------------------------------------------- property test

KIND = st.sampled_from(list(RecordKind))
BODY = st.binary(max_size=120)


class JournalMachine(RuleBasedStateMachine):
    """Random append/read/commit/reopen sequences against an in-memory model."""

    SEGMENT = 200
    MAX = 1000

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="journal-prop-"))
        self.config = cfg(
            self.dir, segment_bytes=self.SEGMENT, max_bytes=self.MAX, tail_cache_bytes=300
        )
        self.j = IngestJournal(self.config, consumers=("a", "b"))
        self.records: dict[int, tuple[RecordKind, bytes]] = {}
        self.ckpt = {"a": 0, "b": 0}
        self.head = 0

    def depth(self) -> int:
        floor = min(self.ckpt.values())
        return sum(HEADER_SIZE + len(p) for s, (_, p) in self.records.items() if s > floor)

    def expect(self, after: int, n: int) -> list[tuple[int, RecordKind, bytes]]:
        seqs = sorted(s for s in self.records if s > after)[:n]
        return [(s, *self.records[s]) for s in seqs]

    @rule(kind=KIND, body=BODY)
    def append(self, kind: RecordKind, body: bytes) -> None:
        fits = self.depth() + HEADER_SIZE + len(body) <= self.MAX
        seq = self.j.append(kind, body)
        if fits:
            assert seq == self.head + 1
            self.head = seq
            self.records[seq] = (kind, body)
        else:
            assert seq is None

    @rule(items=st.lists(st.tuples(KIND, BODY), max_size=6))
    def append_many(self, items: list[tuple[RecordKind, bytes]]) -> None:
        out = self.j.append_many(items)
        room = self.MAX - self.depth()
        expected: list[int | None] = []
        for kind, body in items:
            size = HEADER_SIZE + len(body)
            if size <= room and (not expected or expected[-1] is not None):
                room -= size
                self.head += 1
                self.records[self.head] = (kind, body)
                expected.append(self.head)
            else:
                expected.append(None)
        assert out == expected

    @rule(consumer=st.sampled_from(["a", "b"]), n=st.integers(1, 15))
    def read(self, consumer: str, n: int) -> None:
        got = self.j.read(consumer, n)
        assert [(r.seq, r.kind, r.payload) for r in got] == self.expect(self.ckpt[consumer], n)

    @rule(data=st.data(), n=st.integers(1, 15))
    def read_after(self, data: st.DataObject, n: int) -> None:
        after = data.draw(st.integers(min(self.ckpt.values()), self.head))
        got = self.j.read("a", n, after_seq=after)
        assert [(r.seq, r.kind, r.payload) for r in got] == self.expect(after, n)

    @rule(consumer=st.sampled_from(["a", "b"]), data=st.data())
    def commit(self, consumer: str, data: st.DataObject) -> None:
        seq = data.draw(st.integers(self.ckpt[consumer], self.head))
        self.j.commit(consumer, seq)
        self.ckpt[consumer] = seq

    @precondition(lambda self: self.head > 0)
    @rule()
    def reopen(self) -> None:
        self.j.close()
        self.j = IngestJournal(self.config, consumers=("a", "b"))

    @invariant()
    def state_matches(self) -> None:
        assert self.j.head_seq == self.head
        assert self.j.depth_bytes == self.depth()
        assert {c: self.j.checkpoint(c) for c in self.ckpt} == self.ckpt
        on_disk = sum(p.stat().st_size for p in self.dir.glob("*.seg"))
        assert on_disk <= self.MAX + self.SEGMENT

    def teardown(self) -> None:
        self.j.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestJournalProperties = JournalMachine.TestCase
TestJournalProperties.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
