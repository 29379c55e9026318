"""Property-based tests: many writers committing through the engine in random interleavings.

Whatever the interleaving, the log must stay a contiguous sequence of versions, every commit that
reported success must be in it exactly once and every failed one not at all, and each committed
transaction must have seen what the isolation level promises: under Serializable, the files it
read are exactly the files live in its partition just before its own commit (a transaction that
writes nothing serializes at its read version instead, as in Delta); under
WriteSerializable, the same except for files blind appends added meanwhile.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_delta_occ.engine import DeltaConcurrentModificationException, DeltaLog, Transaction
from airflow_delta_occ.engine.actions import AddFile

from .logbuilder import LogBuilder, commit_info, metadata, protocol

pytestmark = pytest.mark.unit

KINDS = ("append", "update", "delete")
PARTITIONS = ("DE", "FR")

ops = st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(PARTITIONS)), min_size=2, max_size=6)


def _file(kind: str, country: str) -> AddFile:
    return AddFile(path=f"country={country}/{kind}-{uuid.uuid4().hex[:8]}.parquet",
                   partition_values={"date": "2024-01-01", "country": country}, size=1, modification_time=1,
                   data_change=True, stats=json.dumps({"numRecords": 1}))


def _base(level: str) -> str:
    root = tempfile.mkdtemp(prefix="occ-prop-")
    b = LogBuilder(root)
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata(configuration={"delta.isolationLevel": level}))
    txn = Transaction.start(root)
    txn.add_files([_file("seed", c) for c in PARTITIONS])
    txn.commit()
    return root


@pytest.mark.parametrize("level", ["Serializable", "WriteSerializable"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_interleavings_keep_the_log_serial(level: str, data: st.DataObject) -> None:
    plan = data.draw(ops, label="operations")
    # Each transaction id appears twice: its first appearance starts (reads), its second commits.
    events = data.draw(st.permutations([i for i in range(len(plan)) for _ in (0, 1)]), label="interleaving")
    root = _base(level)
    try:
        txns: dict[int, Transaction] = {}
        reads: dict[int, set[str]] = {}
        committed: dict[int, int] = {}
        failed: set[int] = set()
        blind_files: set[str] = set()
        for i in events:
            kind, country = plan[i]
            if i not in txns:
                txn = Transaction.start(root, operation="WRITE" if kind == "append" else kind.upper())
                if kind != "append":
                    read = txn.read_files(f"country = '{country}'")
                    reads[i] = {f.path for f in read}
                    txn.remove_files(read)
                if kind != "delete":
                    txn.add_files([_file(kind, country)])
                txns[i] = txn
                continue
            try:
                result = txns[i].commit(user_metadata=f"txn-{i}")
            except DeltaConcurrentModificationException:
                failed.add(i)
                continue
            committed[i] = result.version
            if kind == "append":
                blind_files |= {a.path for a in txns[i]._actions if isinstance(a, AddFile)}
            elif reads[i] or kind == "update":
                # (A delete that found nothing writes nothing: it serializes at its read version.)
                before = DeltaLog.for_table(root).snapshot(result.version - 1)
                live = {f.path for f in before.files_matching(f"country = '{country}'")}
                assert reads[i] <= live, "a committed transaction read files that were gone at its commit"
                unseen = live - reads[i]
                if level == "Serializable":
                    assert not unseen, f"Serializable commit missed {unseen}"
                else:
                    assert unseen <= blind_files, f"WriteSerializable commit missed non-blind files {unseen}"

        log = DeltaLog.for_table(root)
        history = log.history()
        versions = sorted(c.version for c in history)
        assert versions == list(range(len(versions))), "versions must be contiguous"
        tags = [c.commit_info.user_metadata for c in history if c.commit_info and c.commit_info.user_metadata]
        assert sorted(tags) == sorted(f"txn-{i}" for i in committed), "each success exactly once, no failure"
        assert len(committed) + len(failed) == len(plan)
        assert all(plan[i][0] != "append" for i in failed), "blind appends never conflict with these operations"
    finally:
        shutil.rmtree(root, ignore_errors=True)
