"""Differential suite: concurrent operations on real delta-spark vs the engine's conflict decisions.

Every scenario copies a small base table, then runs transaction A and transaction B with the
interleaving delta-spark's own suites use: A reads the table and is held at its commit (by
``GateLogStore``), B commits, A is released. The real outcome for A is recorded. Then:

* the engine is fed the same log and exactly the actions A staged (captured at the gate), with the
  reads A's operation makes recorded by an engine ``Transaction``; its commit-time check over B's
  commit must give the same outcome, and its isolation level and blind-append flag must equal
  what delta-spark wrote in A's commitInfo;
* the planner, given only the two operations and the base snapshot, must predict the conflict
  (``delta`` model), or be conservative in a case listed in ``PLANNER_CONSERVATIVE`` and in
  docs/conflict-models.md.

WriteSerializable tables are reached through an engine metadata commit (OSS refuses to set it),
which also proves that delta-spark reads and commits on top of engine-written commits.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog, IsolationLevel, Transaction, check_winning_commit
from airflow_delta_occ.engine.actions import parse_json_actions
from airflow_delta_occ.engine.conflicts import WinningCommit
from airflow_delta_occ.engine.early_abort import certain_conflict, running_commit
from airflow_delta_occ.engine.errors import DeltaConcurrentModificationException
from airflow_delta_occ.engine.planner import Operation, TableState, can_conflict, plan_footprint, verdict
from airflow_delta_occ.pools.compare import PlannedJob, compact, lease_verdict
from airflow_delta_occ.spark.early_abort import compaction_settings

from .differential.harness import run_interleaved

_columns = itertools.count()


@dataclass(frozen=True)
class Op:
    """One operation: how Spark runs it, what it reads (engine side), how the planner sees it."""

    name: str
    kind: Operation
    run: Callable[[Any, str, int, bool], None]          # (session, path, part, partitioned)
    predicate: Callable[[int, bool], str | None]          # the filter the operation reads with
    inserts_into_part: bool = False                       # new rows land only in partition `part`
    app_id: str | None = None                             # txnAppId of an idempotent writer
    target_alias: str | None = None                       # the MERGE target's alias in `predicate`
    reads_whole_table: bool = False                       # a NOT MATCHED BY SOURCE MERGE: scans every file


def _sql(template: str) -> Callable[[Any, str, int, bool], None]:
    def run(session: Any, path: str, part: int, partitioned: bool) -> None:
        session.sql(template.format(t=f"delta.`{path}`", part=part, n=next(_columns))).collect()
    return run


def _optimize(zorder: bool) -> Callable[[Any, str, int, bool], None]:
    def run(session: Any, path: str, part: int, partitioned: bool) -> None:
        where = f" WHERE p = {part}" if partitioned else ""
        session.sql(f"OPTIMIZE delta.`{path}`{where}" + (" ZORDER BY (id)" if zorder else "")).collect()
    return run


def _replace_where(session: Any, path: str, part: int, partitioned: bool) -> None:
    df = session.createDataFrame([(500 + part, part, 0)], "id INT, p INT, v INT")
    df.write.format("delta").mode("overwrite").option("replaceWhere", f"p = {part}").save(path)


def _idempotent_append(session: Any, path: str, part: int, partitioned: bool) -> None:
    # Delta looks up the app id's last version before writing: a read dependency on that id.
    df = session.createDataFrame([(700 + part, part, 0)], "id INT, p INT, v INT")
    df.write.format("delta").mode("append").option("txnAppId", "nightly-load").option("txnVersion", part).save(path)


OPS = {op.name: op for op in [
    Op("INSERT", Operation.INSERT, _sql("INSERT INTO {t} VALUES (100 + {part}, {part}, 0)"),
       lambda part, partitioned: None, inserts_into_part=True),
    Op("INSERT_SELF_READ", Operation.INSERT_SELF_READ,
       _sql("INSERT INTO {t} SELECT id + 1000, p, v FROM {t} WHERE p = {part}"),
       lambda part, partitioned: f"p = {part}", inserts_into_part=True),
    Op("MERGE", Operation.MERGE,
       _sql("MERGE INTO {t} AS t USING (SELECT {part} AS id, {part} AS p, 5 AS v) AS s "
            "ON t.id = s.id AND t.p = {part} WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *"),
       lambda part, partitioned: f"p = {part}", inserts_into_part=True),
    # The same MERGE as the planner sees a confined DeltaMergeOperator: the whole ON condition, with the
    # join conjunct on the source's column (which neither narrows nor widens what Delta records).
    Op("MERGE_JOIN", Operation.MERGE,
       _sql("MERGE INTO {t} AS t USING (SELECT {part} AS id, {part} AS p, 5 AS v) AS s "
            "ON t.id = s.id AND t.p = {part} WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *"),
       lambda part, partitioned: f"t.id = s.id AND t.p = {part}", inserts_into_part=True, target_alias="t"),
    # A MERGE with a NOT MATCHED BY SOURCE clause, every clause confined to partition `part`: delta-spark 4.4
    # scans every file (filterFiles(true)) and rewrites every file of the table, copying other partitions' rows.
    Op("MERGE_NMBS", Operation.MERGE,
       _sql("MERGE INTO {t} AS t USING (SELECT 900 + {part} AS id, {part} AS p, 0 AS v) AS s "
            "ON t.id = s.id AND t.p = {part} WHEN NOT MATCHED THEN INSERT * "
            "WHEN NOT MATCHED BY SOURCE AND (t.p = {part}) THEN DELETE"),
       lambda part, partitioned: f"p = {part}", inserts_into_part=True, reads_whole_table=True),
    Op("MERGE_NMBS_UPDATE", Operation.MERGE,
       _sql("MERGE INTO {t} AS t USING (SELECT 900 + {part} AS id, {part} AS p, 0 AS v) AS s "
            "ON t.id = s.id AND t.p = {part} WHEN NOT MATCHED THEN INSERT * "
            "WHEN NOT MATCHED BY SOURCE AND (t.p = {part}) THEN UPDATE SET v = t.v + 1"),
       lambda part, partitioned: f"p = {part}", inserts_into_part=True, reads_whole_table=True),
    Op("UPDATE", Operation.UPDATE, _sql("UPDATE {t} SET v = v + 1 WHERE p = {part}"),
       lambda part, partitioned: f"p = {part}"),
    Op("DELETE", Operation.DELETE, _sql("DELETE FROM {t} WHERE p = {part} AND id = {part}"),
       lambda part, partitioned: f"p = {part} AND id = {part}"),
    Op("OPTIMIZE", Operation.OPTIMIZE, _optimize(False),
       lambda part, partitioned: f"p = {part}" if partitioned else None),
    Op("OPTIMIZE_ZORDER", Operation.OPTIMIZE_ZORDER, _optimize(True),
       lambda part, partitioned: f"p = {part}" if partitioned else None),
    Op("REPLACE_WHERE", Operation.REPLACE_WHERE, _replace_where, lambda part, partitioned: f"p = {part}",
       inserts_into_part=True),
    Op("SET_PROPERTIES", Operation.SET_PROPERTIES,
       _sql("ALTER TABLE {t} SET TBLPROPERTIES ('team' = 'owner-{n}')"), lambda part, partitioned: None),
    Op("ADD_COLUMN", Operation.SCHEMA_CHANGE, _sql("ALTER TABLE {t} ADD COLUMNS (extra_{n} STRING)"),
       lambda part, partitioned: None),
    Op("IDEMPOTENT_APPEND", Operation.INSERT, _idempotent_append, lambda part, partitioned: None,
       inserts_into_part=True, app_id="nightly-load"),
    Op("ENABLE_DV", Operation.SET_PROPERTIES,
       _sql("ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"),
       lambda part, partitioned: None),
]}

P, U = True, False      # partitioned / unpartitioned
S, WS = "Serializable", "WriteSerializable"
SAME, DIFF = True, False
# delta-spark 4.4.0's real outcome for A, as recorded by this suite (asserted, so a broken
# interleaving that lets everything commit cannot pass unnoticed).
OK, APPEND, DELETE_READ, METADATA, TXN = (None, "ConcurrentAppendException", "ConcurrentDeleteReadException",
                                          "MetadataChangedException", "ConcurrentTransactionException")

# A (reads first, commits last), B (commits while A is held), layout, deletion vectors, level,
# same or different partitions (p values), outcome for A.
SCENARIOS: list[tuple[str, str, bool, bool, str, bool, str | None]] = [
    ("UPDATE", "UPDATE", P, False, S, SAME, APPEND),
    ("UPDATE", "UPDATE", P, False, S, DIFF, OK),
    ("DELETE", "INSERT", P, False, S, SAME, APPEND),
    ("DELETE", "INSERT", P, False, S, DIFF, OK),
    ("MERGE", "MERGE", P, False, S, SAME, APPEND),
    ("MERGE", "MERGE", P, False, S, DIFF, OK),
    ("INSERT", "INSERT", P, False, S, SAME, OK),
    ("OPTIMIZE", "INSERT", P, False, S, SAME, OK),
    ("INSERT", "OPTIMIZE", P, False, S, SAME, OK),
    ("DELETE", "OPTIMIZE", P, False, S, SAME, APPEND),
    ("DELETE", "OPTIMIZE", P, False, S, DIFF, OK),
    ("OPTIMIZE", "DELETE", P, False, S, SAME, DELETE_READ),
    ("OPTIMIZE", "OPTIMIZE", P, False, S, SAME, DELETE_READ),
    ("OPTIMIZE_ZORDER", "UPDATE", P, False, S, SAME, DELETE_READ),
    ("UPDATE", "OPTIMIZE_ZORDER", P, False, S, DIFF, OK),
    ("REPLACE_WHERE", "REPLACE_WHERE", P, False, S, SAME, APPEND),
    ("REPLACE_WHERE", "REPLACE_WHERE", P, False, S, DIFF, OK),
    ("UPDATE", "SET_PROPERTIES", P, False, S, SAME, METADATA),
    ("INSERT", "ADD_COLUMN", P, False, S, SAME, METADATA),
    ("SET_PROPERTIES", "SET_PROPERTIES", P, False, S, SAME, METADATA),
    ("INSERT_SELF_READ", "INSERT", P, False, S, SAME, APPEND),
    ("INSERT_SELF_READ", "INSERT", P, False, S, DIFF, OK),
    ("MERGE", "INSERT", P, False, S, DIFF, OK),
    ("INSERT", "MERGE", P, False, S, SAME, OK),
    ("DELETE", "UPDATE", P, False, S, SAME, APPEND),
    ("UPDATE", "ENABLE_DV", P, False, S, SAME, OK),
    ("DELETE", "INSERT", P, False, WS, SAME, OK),
    ("UPDATE", "UPDATE", P, False, WS, SAME, APPEND),
    ("MERGE", "INSERT", P, False, WS, SAME, OK),
    ("INSERT_SELF_READ", "INSERT", P, False, WS, SAME, OK),
    ("ADD_COLUMN", "INSERT", P, False, WS, SAME, OK),
    ("UPDATE", "UPDATE", P, False, WS, DIFF, OK),
    ("UPDATE", "UPDATE", P, True, S, SAME, APPEND),
    ("UPDATE", "UPDATE", P, True, S, DIFF, OK),
    ("DELETE", "DELETE", P, True, S, SAME, DELETE_READ),
    ("OPTIMIZE", "DELETE", P, True, S, SAME, DELETE_READ),
    ("DELETE", "OPTIMIZE", P, True, S, SAME, APPEND),
    ("DELETE", "INSERT", P, True, S, DIFF, OK),
    ("UPDATE", "UPDATE", U, False, S, DIFF, APPEND),
    ("DELETE", "INSERT", U, False, S, DIFF, APPEND),
    ("INSERT", "INSERT", U, False, S, SAME, OK),
    ("OPTIMIZE", "INSERT", U, False, S, SAME, OK),
    ("MERGE", "MERGE", U, False, S, DIFF, APPEND),
    ("UPDATE", "SET_PROPERTIES", U, False, S, SAME, METADATA),
    ("DELETE", "DELETE", U, True, S, DIFF, OK),
    ("UPDATE", "INSERT", U, True, S, DIFF, APPEND),
    ("OPTIMIZE", "DELETE", U, True, S, SAME, DELETE_READ),
    ("DELETE", "INSERT", U, True, WS, DIFF, OK),
    ("UPDATE", "UPDATE", U, True, WS, DIFF, APPEND),
    ("IDEMPOTENT_APPEND", "IDEMPOTENT_APPEND", P, False, S, DIFF, TXN),
    ("IDEMPOTENT_APPEND", "IDEMPOTENT_APPEND", P, False, WS, DIFF, TXN),
    # A MERGE with a join condition, confined to its partition, against writers of other partitions and
    # of its own, under both levels.
    *[("MERGE_JOIN", b, P, False, level, same, outcome)
      for level in (S, WS)
      for b, same, outcome in (("UPDATE", DIFF, OK), ("DELETE", DIFF, OK), ("OPTIMIZE", DIFF, OK),
                               ("MERGE_JOIN", DIFF, OK), ("UPDATE", SAME, APPEND), ("DELETE", SAME, DELETE_READ),
                               ("OPTIMIZE", SAME, APPEND), ("MERGE_JOIN", SAME, APPEND))],
    ("UPDATE", "MERGE_JOIN", P, False, S, DIFF, OK),
    ("DELETE", "MERGE_JOIN", P, False, S, DIFF, OK),
    ("OPTIMIZE", "MERGE_JOIN", P, False, S, DIFF, OK),
    ("MERGE_JOIN", "MERGE_JOIN", U, False, S, DIFF, APPEND),
    # A NOT MATCHED BY SOURCE MERGE confined to p=2 commits first. Without deletion vectors it removes and
    # re-adds every file of the table, p=1's too (its rows copied): a reader of p=1 sees the new p=1 files
    # (append check, before the delete-read check), a compaction of p=1 its removed files; a blind append
    # commits. With deletion vectors it rewrote only p=2 here (see PLANNER_CONSERVATIVE).
    ("UPDATE", "MERGE_NMBS", P, False, S, DIFF, APPEND),
    ("UPDATE", "MERGE_NMBS_UPDATE", P, False, S, DIFF, APPEND),
    ("UPDATE", "MERGE_NMBS", P, False, WS, DIFF, APPEND),
    ("UPDATE", "MERGE_NMBS", P, True, S, DIFF, OK),
    ("OPTIMIZE", "MERGE_NMBS", P, False, S, DIFF, DELETE_READ),
    ("INSERT", "MERGE_NMBS", P, False, S, DIFF, OK),
    # ... or commits last, having read the whole table.
    ("MERGE_NMBS", "UPDATE", P, False, S, DIFF, APPEND),
    ("MERGE_NMBS", "INSERT", P, False, S, DIFF, APPEND),
]

# Scenarios where the planner says "conflict" and delta-spark commits, with the reason; mirrored in
# docs/conflict-models.md. Any other disagreement fails the suite.
PLANNER_CONSERVATIVE: dict[str, str] = {
    "DELETE-vs-DELETE-unpart-dv-Serializable-diff": (
        "B's DELETE removed whole files and added none; before running, a DELETE may rewrite (add) files, "
        "and any added file conflicts on an unpartitioned table"),
    "UPDATE-vs-MERGE_NMBS-part-dv-Serializable-diff": (
        "with deletion vectors the NOT MATCHED BY SOURCE MERGE rewrote only its own partition, but the session "
        "setting spark.databricks.delta.merge.deletionVectors.persistent=false (not visible to the planner) makes it "
        "rewrite every file of the table as it does without deletion vectors"),
}


# Scenarios where delta-spark fails A and early abort's judge, given A's plan and B's commit while A runs, is
# not certain of it (so A runs to its commit, as it would without early abort), with the reason; mirrored in
# docs/early-abort.md. A judge that is certain where delta-spark commits fails the suite in every scenario.
EARLY_ABORT_MISSES: dict[str, str] = {
    "DELETE-vs-DELETE-part-dv-Serializable-same": (
        "A's filter has a data conjunct (id = 1): data skipping decides which files it reads, so no file counts as "
        "surely read, and B (deletion vectors) added no file A's partition filter would catch"),
    **{sid: "the application ids a job looks up are not judged (an idempotent writer's id is its own run's)"
       for sid in ("IDEMPOTENT_APPEND-vs-IDEMPOTENT_APPEND-part-nodv-Serializable-diff",
                   "IDEMPOTENT_APPEND-vs-IDEMPOTENT_APPEND-part-nodv-WriteSerializable-diff")},
}


# Scenarios where a conflict pool's lease verdict (partition level, see pools/compare.py) says "conflict" although
# the planner, judging both commit orders at the base snapshot, says they cannot; mirrored in docs/pools.md.
LEASE_CONSERVATIVE: dict[str, str] = {}


def _scenario_id(s: tuple[str, str, bool, bool, str, bool, str | None]) -> str:
    a, b, partitioned, dv, level, same, _ = s
    return (f"{a}-vs-{b}-{'part' if partitioned else 'unpart'}-{'dv' if dv else 'nodv'}-{level}-"
            f"{'same' if same else 'diff'}")


@pytest.fixture(scope="module")
def base_tables(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[bool, bool, str], str]:
    """One small base table per (partitioned, deletion vectors, isolation level), copied per scenario."""
    root = tmp_path_factory.mktemp("differential_bases")
    bases = {}
    for partitioned, dv, level in sorted({(s[2], s[3], s[4]) for s in SCENARIOS}):
        path = str(root / f"{'p' if partitioned else 'u'}_{'dv' if dv else 'nodv'}_{level}")
        spark.sql(
            f"CREATE TABLE delta.`{path}` (id INT, p INT, v INT) USING delta "
            + ("PARTITIONED BY (p) " if partitioned else "")
            + f"TBLPROPERTIES ('delta.enableDeletionVectors' = '{str(dv).lower()}')"
        )
        # Two files per partition so OPTIMIZE has work; ids 1, 3 in p=1 and 2, 4 in p=2.
        spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 1, 0), (2, 2, 0)")
        spark.sql(f"INSERT INTO delta.`{path}` VALUES (3, 1, 0), (4, 2, 0)")
        if level == WS:
            txn = Transaction.start(path, operation="SET TBLPROPERTIES")
            txn.set_table_properties({"delta.isolationLevel": "WriteSerializable"})
            txn.commit()
        bases[(partitioned, dv, level)] = path
    return bases


def _engine_outcome(path: str, a: Op, part: int, partitioned: bool, staged: list[dict[str, Any]]
                    ) -> tuple[str | None, IsolationLevel, bool, dict[str, Any]]:
    """The engine's verdict on A's staged commit against every commit that won since A read."""
    info = next(x["commitInfo"] for x in staged if "commitInfo" in x)
    body = "\n".join(__import__("json").dumps(x) for x in staged if "commitInfo" not in x).encode()
    actions = parse_json_actions(body, "<staged by A>")
    log = DeltaLog.for_table(path)
    read_version = int(info["readVersion"])
    txn = Transaction(log, log.snapshot(read_version), operation=info["operation"])
    predicate = a.predicate(part, partitioned)
    if a.kind in (Operation.OPTIMIZE, Operation.OPTIMIZE_ZORDER):
        # OPTIMIZE records exactly the files it compacts, plus its partition filter.
        removed = {x["remove"]["path"] for x in staged if "remove" in x}
        txn.track_read([f for f in txn.snapshot.files() if f.path in removed], predicate)  # type: ignore[union-attr]
    elif a.reads_whole_table:
        txn.read_files(None)  # findTouchedFiles: filterFiles(Seq(TrueLiteral)), every file and predicate TRUE
    elif a.kind not in (Operation.INSERT, Operation.SET_PROPERTIES, Operation.SCHEMA_CHANGE):
        txn.read_files(predicate, target_alias=a.target_alias)
    if a.app_id is not None:
        txn.txn_version(a.app_id)
    txn.stage(*actions)
    pending, level = txn.prepare()
    token = info.get("userMetadata")
    outcome = None
    for commit in log.commits_after(read_version):
        if commit.commit_info is not None and commit.commit_info.user_metadata == token:
            continue  # A's own commit, when A won
        try:
            pending = check_winning_commit(pending, WinningCommit.of(commit), level)
        except DeltaConcurrentModificationException as exc:
            outcome = type(exc).__name__
            break
    return outcome, level, pending.is_blind_append, info


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[_scenario_id(s) for s in SCENARIOS])
def test_engine_and_planner_agree_with_delta_spark(spark: Any, base_tables: Any, tmp_path: Any,
                                                  scenario: tuple[str, str, bool, bool, str, bool, str | None],
                                                  ) -> None:
    a_name, b_name, partitioned, dv, level, same, expected = scenario
    a, b = OPS[a_name], OPS[b_name]
    path = str(tmp_path / "t")
    shutil.copytree(base_tables[(partitioned, dv, level)], path)
    base = DeltaLog.for_table(path).snapshot()
    a_part, b_part = 1, 1 if same else 2

    result = run_interleaved(spark, lambda s: a.run(s, path, a_part, partitioned),
                             lambda s: b.run(s, path, b_part, partitioned))
    assert result.b_outcome is None, f"B must commit alone: {result.b_error!r}"
    assert result.a_staged is not None, f"A never reached its commit: {result.a_error!r}"
    assert result.a_outcome is None or not result.a_outcome.startswith("other"), result.a_outcome

    assert result.a_outcome == expected, f"delta-spark behaved differently than recorded: {result.a_outcome}"
    engine, engine_level, engine_blind, info = _engine_outcome(path, a, a_part, partitioned, result.a_staged)
    assert engine == result.a_outcome, f"delta-spark: {result.a_outcome}, engine: {engine}"
    assert engine_level.value == info["isolationLevel"]
    assert engine_blind == info["isBlindAppend"]

    # Early abort: B's commit judged while A runs, from A's plan alone (its read version, its filter, and
    # whether it commits: here, whether it staged anything; the runner knows that otherwise).
    sid = _scenario_id(scenario)
    log = DeltaLog.for_table(path)
    read_version = int(info["readVersion"])
    running = running_commit(log.snapshot(read_version), a.kind, a.predicate(a_part, partitioned), label=a.name,
                             commits=any("commitInfo" not in x for x in result.a_staged),
                             target_alias=a.target_alias, reads_whole_table=a.reads_whole_table,
                             compaction=compaction_settings(spark))
    if a.kind in (Operation.OPTIMIZE, Operation.OPTIMIZE_ZORDER):
        # The files early abort counts as certain are files A rewrote: a wrong certainty could abort a compaction
        # that commits. (Here A rewrites every file of its partitions: two small ones each.)
        staged_removes = {x["remove"]["path"] for x in result.a_staged if "remove" in x}
        assert {path for path, _ in running.rewrites} == staged_removes and running.commits
    token = info.get("userMetadata")
    early = certain_conflict(running, [c for c in log.commits_after(read_version)
                                       if c.commit_info is None or c.commit_info.user_metadata != token])
    if early is not None:
        assert result.a_outcome == early.kind.value, f"early abort would stop a job delta-spark commits: {early}"
    elif result.a_outcome is not None:
        assert sid in EARLY_ABORT_MISSES, f"early abort misses a certain {result.a_outcome} in {sid}"
    else:
        assert sid not in EARLY_ABORT_MISSES

    def footprint(op: Op, part: int) -> Any:
        pinned = [{"p": part}] if op.inserts_into_part and partitioned and op.kind is not Operation.REPLACE_WHERE \
            else None
        return plan_footprint(base, op.kind, op.predicate(part, partitioned), label=op.name, write_partitions=pinned,
                              app_id=op.app_id, target_alias=op.target_alias, reads_whole_table=op.reads_whole_table,
                              properties={"delta.enableDeletionVectors": "true"} if op.name == "ENABLE_DV"
                              else {"team": "x"} if op.kind is Operation.SET_PROPERTIES else None)

    planned = verdict(winner=footprint(b, b_part), loser=footprint(a, a_part), snapshot=base, model="delta")
    if result.a_outcome is not None:
        assert planned.conflict, f"planner missed a real {result.a_outcome}: {planned.reason}"
    elif planned.conflict:
        assert sid in PLANNER_CONSERVATIVE, f"planner is conservative in an unlisted case {sid}: {planned.reason}"

    # A pool never grants both when delta-spark fails one of them or the planner says they can conflict. It
    # cannot know which commits first, so its reference is the planner's verdict over both orders.
    state = TableState.of(base)
    fa, fb = footprint(a, a_part), footprint(b, b_part)
    leased = lease_verdict(PlannedJob(compact(fa), state), PlannedJob(compact(fb), state), "delta")
    if result.a_outcome is not None or planned.conflict:
        assert leased.conflict, f"a pool would grant both: {leased.reason}"
    elif leased.conflict and not can_conflict(fa, fb, base, "delta").conflict:
        assert sid in LEASE_CONSERVATIVE, f"lease verdict is conservative in an unlisted case {sid}: {leased.reason}"
