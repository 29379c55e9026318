"""Early abort, pair by pair: every interleaving of the differential suite, replayed with a long provider job.

    .venv/bin/python benchmarks/early_abort_pairs.py              # every pair, then docs/benchmarks.md
    .venv/bin/python benchmarks/early_abort_pairs.py --only UPDATE-vs-UPDATE --no-write   # a quick look

The differential suite (tests/spark/test_differential.py) holds the engine's early-abort judge to delta-spark's
own commit check on small tables, where A's statement takes a fraction of a second. This run proves the whole
path on real delta-spark, with A long enough to be stopped: for each scenario whose transaction A is a job the
provider runs and watches (UPDATE, DELETE, MERGE, append, overwrite of partitions, OPTIMIZE), on a copy of the
scenario's base table grown by ``--rows`` rows per commit (nine in ten in A's partition, p=1):

1. **Delta's own verdict on this table** (the held run): A runs through its operator with early abort off and is
   held at its commit by the suite's gate (``GateLogStore``; the run id carries the token into userMetadata);
   B, the scenario's other statement, runs and commits; A is released, and delta-spark's check decides. The
   verdict can differ from the suite's small table: a DELETE that removed a whole one-row file there rewrites a
   large file here, so a reader of the partition meets the added file first.
2. **The race**, on another copy: B runs as a foreign writer in its own session (plain SQL, as a streaming job or
   another team's tool would) and is held at its commit; A runs through its operator (embedded mode,
   ``early_abort=True``, an interval of ``INTERVAL`` s) and reads the version before B's commit; once A's watch
   judges its attempt, B is released and commits while A works. Then:

   - delta-spark failed A in the held run: A's first attempt is stopped early with the same exception and B's
     version, within two watch intervals of B's commit file (plus the log's own time); nothing of it is
     committed (the log after the base holds what the held run's holds: B's commit, then A's one). Or, for a
     scenario in the suite's ``EARLY_ABORT_MISSES``, A is never stopped and its own commit check raises that
     exception;
   - delta-spark committed A in the held run: A is never stopped and commits at its first attempt;

   and the final table equals the held run's.

The suite's NOT MATCHED BY SOURCE MERGE (A in two scenarios, both on a partitioned table) is replayed with an
unconditional ``WHEN MATCHED`` update added to its clauses: the provider watches a MERGE only when every source row
is sure to update or insert, and the held run gives delta-spark's verdict for that MERGE. A compaction that lost its
files is skipped by its default policy; here it is retried, as every conflict is, and its retry may find nothing
left to compact (the log then holds B's commit alone, as in the held run). A scenario whose A is not such a job (a
schema or property change, an INSERT that reads its own table, an idempotent append sharing another writer's
application id) is listed as not replayed, with the reason. A DELETE on a table with deletion vectors writes only
vectors, and one of a few rows ended within the watch's interval (measured: it finished its Spark work before the
cancel reached it); it deletes every row of its partition here, so that its scan takes seconds.
Any violation fails the run (exit 1) and nothing is written.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _report import machine, write_section  # noqa: E402

INTERVAL = 0.5
CANCEL_SLACK = 0.5   # the judge's and the log's own time, as in tests/spark/test_early_abort.py
WATCH_LOGGER = "airflow_delta_occ"
FAST_RETRY = {"action": "retry", "initial_delay": 0.0, "jitter": 0.0}   # a compaction's default skips: retried here
SKIPPED = {
    "SET_PROPERTIES": "no provider job changes table properties",
    "ADD_COLUMN": "no provider job changes the schema",
    "INSERT_SELF_READ": "no provider job appends rows it reads from its own target",
    "IDEMPOTENT_APPEND": "a provider job's application id is its own run's, never another writer's",
}


WATCH_DECIDED = ("Early abort judges this attempt", "Early abort does not judge", "Early abort is off",
                 "Early abort does not watch", "Early abort stops judging")


class Lines(logging.Handler):
    """The provider's log lines as (when, line): what the task log shows."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.created, record.getMessage()))

    def since(self, start: int) -> list[tuple[float, str]]:
        return list(self.lines[start:])


@dataclass
class Outcome:
    """One replayed scenario."""

    scenario: str
    recorded: str | None
    replayed: bool = True
    note: str = ""
    judged: bool = False
    stopped: bool = False
    stopped_after: float | None = None      # seconds from B's commit file to the cancel's log line
    kind: str | None = None
    attempts: int = 0
    seconds: float = 0.0
    exact: bool = False
    delta: str | None = None                # delta-spark's own verdict on this table (the held baseline)
    problems: list[str] = field(default_factory=list)


def build_base(spark: Any, path: str, partitioned: bool, dv: bool, level: str, rows: int) -> None:
    """The differential's base table (ids 1, 3 in p=1 and 2, 4 in p=2, two files per partition), each commit
    grown by ``rows`` filler rows (ids from 1000), nine in ten of them in p=1, where A works: A's statement takes
    seconds, and B's in p=2 little (B's work is done before A starts anyway: it is held at its commit)."""
    from airflow_delta_occ.engine import Transaction

    spark.sql(f"CREATE TABLE delta.`{path}` (id INT, p INT, v INT) USING delta "
              + ("PARTITIONED BY (p) " if partitioned else "")
              + f"TBLPROPERTIES ('delta.enableDeletionVectors' = '{str(dv).lower()}')")
    for commit, ids in enumerate(((1, 2), (3, 4))):
        start = 1000 + commit * rows
        filler = spark.range(rows).selectExpr(f"CAST(id + {start} AS INT) AS id",
                                              "CAST(IF(id % 10 = 0, 2, 1) AS INT) AS p", "0 AS v")
        named = spark.createDataFrame([(ids[0], 1, 0), (ids[1], 2, 0)], "id INT, p INT, v INT")
        named.unionByName(filler).coalesce(1).write.format("delta").mode("append").save(path)
    if level == "WriteSerializable":
        txn = Transaction.start(path, operation="SET TBLPROPERTIES")
        txn.set_table_properties({"delta.isolationLevel": "WriteSerializable"})
        txn.commit()


def write_source(spark: Any, path: str, rows: list[tuple[int, int, int]] | None, filler: int = 0) -> str:
    df = spark.createDataFrame(rows or [], "id INT, p INT, v INT")
    if filler:
        df = df.unionByName(spark.range(filler).selectExpr("CAST(id + 50000000 AS INT) AS id", "1 AS p", "7 AS v"))
    df.coalesce(1).write.format("delta").save(path)
    return path


def operator(a: str, table: str, partitioned: bool, dv: bool, sources: dict[str, str], early: bool, task: str
             ) -> Any:
    """A's statement as the provider's operator (A works on p=1), or ``None`` for a kind it does not run."""
    from airflow_delta_occ.operators.delta import (
        DeltaAppendOperator,
        DeltaDeleteOperator,
        DeltaMergeOperator,
        DeltaOptimizeOperator,
        DeltaOverwritePartitionsOperator,
        DeltaUpdateOperator,
    )

    common: dict[str, Any] = {"task_id": task, "table": table, "early_abort": early,
                              "early_abort_interval": INTERVAL,
                              "conflict_policies": {"ConcurrentAppendException": FAST_RETRY,
                                                    "ConcurrentDeleteReadException": FAST_RETRY,
                                                    "ConcurrentDeleteDeleteException": FAST_RETRY,
                                                    "MetadataChangedException": FAST_RETRY}}
    if partitioned:
        common["partitions"] = {"p": 1}
    where_p = None if partitioned else "p = 1"
    if a == "UPDATE":
        return DeltaUpdateOperator(set={"v": "v + 1"}, where=where_p, **common)
    if a == "DELETE" and dv:   # it writes only vectors: every row of p=1, so that it scans for seconds
        return DeltaDeleteOperator(where="v >= 0" if partitioned else "p = 1 AND v >= 0", **common)
    if a == "DELETE":
        return DeltaDeleteOperator(where="id = 1" if partitioned else "p = 1 AND id = 1", **common)
    if a in ("MERGE", "MERGE_JOIN"):
        return DeltaMergeOperator(source=sources["merge"], merge_condition="t.id = s.id" + ("" if partitioned
                                                                                          else " AND t.p = 1"),
                                  clauses=[{"kind": "matched_update", "set": {"v": "s.v"}},
                                           {"kind": "not_matched_insert_all"}], **common)
    if a == "MERGE_NMBS":   # with an unconditional WHEN MATCHED clause: without one it is not watched
        return DeltaMergeOperator(source=sources["merge"], merge_condition="t.id = s.id",
                                  clauses=[{"kind": "matched_update", "set": {"v": "s.v"}},
                                           {"kind": "not_matched_insert_all"},
                                           {"kind": "not_matched_by_source_delete"}], **common)
    if a == "INSERT":
        return DeltaAppendOperator(source=sources["append"], **common)
    if a == "REPLACE_WHERE":
        return DeltaOverwritePartitionsOperator(source=sources["append"], **common)
    if a in ("OPTIMIZE", "OPTIMIZE_ZORDER"):   # of p=1, or of the whole unpartitioned table (its two files)
        return DeltaOptimizeOperator(zorder_by=["id"] if a == "OPTIMIZE_ZORDER" else [], **common)
    return None


def execute(op: Any, run_id: str) -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="early_abort_pairs", task_id=op.task_id, map_index=-1, try_number=1)
    result: dict[str, Any] = op.execute({"ti": ti, "run_id": run_id})
    return result


def table_rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    """The table's rows, compared as a multiset: its size and a digest of every row (the tables are millions
    of rows; the digest sums a 64-bit hash of each row, order-free)."""
    got = spark.sql(f"SELECT count(*) AS n, sum(CAST(xxhash64(*) AS DECIMAL(38, 0))) AS h, sum(v) AS s "
                    f"FROM delta.`{path}`").collect()[0]
    return [(int(got["n"]), got["h"], got["s"])]


class Gate:
    """One commit held by ``GateLogStore`` (its token in the commit's userMetadata): wait for it, release it."""

    def __init__(self, name: str) -> None:
        from tests.spark.differential.harness import GATE_DIR

        os.makedirs(GATE_DIR, exist_ok=True)
        self.token = f"occ-gate:{name}"
        self.reached, self.release_file = (os.path.join(GATE_DIR, f"{name}.{s}") for s in ("reached", "release"))

    def wait(self, thread: threading.Thread, timeout: float = 300) -> bool:
        """Whether the commit reached the gate (``False``: the thread ended first, or the time ran out)."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.reached):
            if not thread.is_alive() or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def release(self) -> None:
        with open(self.release_file, "w"):
            pass

    def clear(self) -> None:
        for path in (self.reached, self.release_file):
            if os.path.exists(path):
                os.remove(path)


def in_thread(done: dict[str, Any], key: str, work: Callable[[], Any]) -> threading.Thread:
    """Run ``work`` in a thread; its value (or its exception, under ``<key>_error``) lands in ``done``."""
    def run() -> None:
        try:
            done[key] = work()
        except BaseException as exc:   # reported by the caller
            done[f"{key}_error"] = exc
    thread = threading.Thread(target=run, name=key, daemon=True)
    thread.start()
    return thread


def first_kind(result: dict[str, Any]) -> str | None:
    conflicts = result["conflicts"]
    return str(conflicts[0]["kind"]) if conflicts else None


def baseline(spark: Any, a_name: str, b: Any, b_part: int, partitioned: bool, dv: bool, table: str,
             sources: dict[str, str], tag: str, out: Outcome) -> tuple[list[tuple[Any, ...]], int] | None:
    """Delta's own verdict on this table: A (its operator, no early abort) held at its commit by the gate while B
    commits, then released, as the differential suite runs it. Sets ``out.delta``; returns the final table and
    the number of commits after the base."""
    from airflow_delta_occ.engine import DeltaLog

    base_version = DeltaLog.for_table(table).latest_version()
    gate, done = Gate(f"a-{tag}"), dict[str, Any]()
    thread = in_thread(done, "a", lambda: execute(operator(a_name, table, partitioned, dv, sources, False, "a"),
                                                  gate.token))   # the run id carries the token into userMetadata
    try:
        if not gate.wait(thread):
            out.problems.append(f"baseline: A never reached its commit: {done.get('a_error')!r}")
            return None
        b.run(spark.newSession(), table, b_part, partitioned)
    finally:
        gate.release()   # kept until A ends: its retry's commit passes the gate too
        thread.join(600)
        gate.clear()
    if "a_error" in done:
        out.problems.append(f"baseline: A failed: {type(done['a_error']).__name__}: {str(done['a_error'])[:200]}")
        return None
    out.delta = first_kind(done["a"])
    return table_rows(spark, table), len(DeltaLog.for_table(table).commits_after(base_version))


def replay(spark: Any, scenario: tuple[Any, ...], base: str, work: Path, sources: dict[str, str],
           lines: Lines) -> Outcome:
    from airflow_delta_occ.engine import DeltaLog
    from airflow_delta_occ.engine.log_segment import commit_file_name
    from tests.spark.differential.harness import USER_METADATA_CONF
    from tests.spark.test_differential import EARLY_ABORT_MISSES, OPS, _scenario_id

    a_name, b_name, partitioned, dv, _level, same, recorded = scenario
    sid = _scenario_id(scenario)
    out = Outcome(sid, recorded)
    if a_name in SKIPPED:
        out.replayed = False
        out.note = SKIPPED[a_name]
        return out
    b, b_part = OPS[b_name], 1 if same else 2
    tag = uuid.uuid4().hex[:8]

    # Delta's own verdict and the final table, on a copy: A held at its commit while B commits.
    held = str(work / f"held-{tag}")
    shutil.copytree(base, held)
    held_run = baseline(spark, a_name, b, b_part, partitioned, dv, held, sources, tag, out)
    shutil.rmtree(held, ignore_errors=True)
    if held_run is None:
        return out
    expected, expected_commits = held_run

    # The race: B held at its commit, A started with early abort, B released once A's watch judges.
    table = str(work / f"race-{tag}")
    shutil.copytree(base, table)
    base_version = DeltaLog.for_table(table).latest_version()
    gate, done = Gate(f"b-{tag}"), dict[str, Any]()
    session_b = spark.newSession()
    session_b.conf.set(USER_METADATA_CONF, gate.token)
    b_thread = in_thread(done, "b", lambda: b.run(session_b, table, b_part, partitioned))
    try:
        if not gate.wait(b_thread):
            out.problems.append(f"B never reached its commit: {done.get('b_error')!r}")
            return out
        mark = len(lines.lines)
        started = time.monotonic()
        a_thread = in_thread(done, "a", lambda: execute(operator(a_name, table, partitioned, dv, sources, True, "a"),
                                                         f"race__{tag}"))
        deadline = time.monotonic() + 300
        while not any(line.startswith(WATCH_DECIDED) for _, line in lines.since(mark)):
            if not a_thread.is_alive() or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        out.judged = any(line.startswith("Early abort judges this attempt") for _, line in lines.since(mark))
    finally:
        gate.release()
        b_thread.join(300)
    a_thread.join(600)
    gate.clear()
    out.seconds = round(time.monotonic() - started, 1)
    if "b_error" in done:   # A committed before B could: A too short for the replay to mean anything
        out.problems.append(f"B failed (A committed first?): {type(done['b_error']).__name__}: "
                            f"{str(done['b_error'])[:200]}")
        return out
    if "a_error" in done:
        out.problems.append(f"A failed: {type(done['a_error']).__name__}: {str(done['a_error'])[:300]}")
        return out

    result = done["a"]
    commits = DeltaLog.for_table(table).commits_after(base_version)
    b_version = base_version + 1
    landed = os.path.getmtime(os.path.join(table, "_delta_log", commit_file_name(b_version)))
    conflicts = result["conflicts"]
    out.attempts = result["attempts"]
    first = conflicts[0] if conflicts else None
    out.stopped = bool(first and first["early"])
    out.kind = first_kind(result)
    cancels = sorted(at for at, line in lines.since(mark) if line.startswith("Early abort: version"))
    if cancels:
        out.stopped_after = round(cancels[0] - landed, 2)
    out.exact = table_rows(spark, table) == expected
    shutil.rmtree(table, ignore_errors=True)

    if not out.judged:
        out.problems.append("A's watch never judged its attempt (the replay proves nothing)")
    if commits[0].commit_info is None or commits[0].commit_info.user_metadata != gate.token:
        out.problems.append(f"B did not commit first: {[c.commit_info for c in commits]}")
    if len(commits) != expected_commits:   # B's, and A's one unless its retry found nothing left to compact
        out.problems.append(f"the log after the base holds {len(commits)} commits, the held run's {expected_commits}")
    if not out.exact:
        out.problems.append(f"the table differs from the one Delta's own check left {expected}")
    if out.delta is None:
        if conflicts or cancels or out.attempts != 1:
            out.problems.append(f"delta-spark commits A, but A was stopped or retried: {conflicts}")
    elif out.stopped and first is not None:
        if out.kind != out.delta or first["winning_version"] != b_version:
            out.problems.append(f"stopped as {out.kind} by {first['winning_version']}; delta-spark raised "
                                f"{out.delta} against version {b_version}")
        if out.stopped_after is None or out.stopped_after > 2 * INTERVAL + CANCEL_SLACK:
            out.problems.append(f"cancelled {out.stopped_after} s after B's commit landed")
        if out.attempts != 2:
            out.problems.append(f"{out.attempts} attempts")
    else:
        if sid not in EARLY_ABORT_MISSES:
            out.problems.append(f"delta-spark raised {out.delta}, but A was not stopped early: {conflicts}")
        if out.kind != out.delta or cancels:
            out.problems.append(f"A's own commit check raised {out.kind} (delta-spark: {out.delta})")
    return out


def render(args: argparse.Namespace, outcomes: list[Outcome], seconds: float) -> str:
    replayed = [o for o in outcomes if o.replayed]
    failing = [o for o in replayed if o.delta is not None]
    stopped = [o for o in failing if o.stopped]
    committing = [o for o in replayed if o.delta is None]
    differ = [o for o in replayed if o.delta != o.recorded]
    lags = sorted(o.stopped_after for o in stopped if o.stopped_after is not None)
    rows = ["| scenario (A-vs-B-layout-dv-level-partitions) | delta-spark, suite's table | delta-spark, this table | "
            "A stopped early | after B's commit | attempts | table exact |", "|---|---|---|---|---:|---:|---|"]
    for o in outcomes:
        if not o.replayed:
            rows.append(f"| {o.scenario} | {o.recorded or 'commits'} | | not replayed: {o.note} | | | |")
            continue
        cell = f"yes, {o.kind}" if o.stopped else f"no, {o.kind} at its commit" if o.kind else "no"
        after = "" if o.stopped_after is None else f"{o.stopped_after:.2f} s"
        rows.append(f"| {o.scenario} | {o.recorded or 'commits'} | {o.delta or 'commits'} | {cell} | {after} | "
                    f"{o.attempts} | {'yes' if o.exact else 'NO'} |")
    return "\n".join([
        f"Measured by `make prove-early-abort` (`benchmarks/early_abort_pairs.py`) on {machine()}. Every scenario "
        f"of the differential suite whose A is a job the provider runs and watches, replayed on real delta-spark "
        f"through A's operator (embedded mode), on the scenario's base table grown by {args.rows:,} rows per "
        f"commit (nine in ten in A's partition). Delta's own verdict on that table comes from a held run (A held "
        f"at its commit while B commits, early abort off); the race holds B at its commit until A's watch judged, "
        f"then releases it (interval {INTERVAL} s). {len(outcomes)} scenarios in {seconds / 60:.1f} min.",
        "",
        f"- Replayed: {len(replayed)}. Of the {len(failing)} that delta-spark fails on these tables, A was stopped "
        f"early in {len(stopped)}, with delta-spark's exception and B's version, nothing of it committed, and the "
        f"retry's table equal to the held run's"
        + ("; in the others delta-spark's own check raised the same exception at A's commit (each is listed in the "
           "suite's `EARLY_ABORT_MISSES`)." if len(stopped) < len(failing) else "."),
        f"- Of the {len(committing)} that delta-spark commits, A was stopped in "
        f"{sum(1 for o in committing if o.stopped)} and committed at its first attempt in "
        f"{sum(1 for o in committing if o.attempts == 1)}.",
        f"- Cancel after B's commit file was written: median {lags[len(lags) // 2]:.2f} s, max {lags[-1]:.2f} s "
        f"(the bound is two intervals, {2 * INTERVAL:.1f} s, plus {CANCEL_SLACK} s)." if lags else
        "- No scenario was stopped early.",
        f"- Delta's verdict on these larger tables differs from the suite's small ones in {len(differ)}"
        + (": " + ", ".join(f"{o.scenario} ({o.recorded or 'commits'} there, {o.delta or 'commits'} here)"
                            for o in differ) if differ else "") + ".",
        "",
        *rows,
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8_000_000, help="filler rows per base commit")
    parser.add_argument("--only", default="", help="replay only scenarios whose id starts with this (or with one "
                                                   "of these, separated by commas)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="early_abort_pairs_airflow_"))
    from airflow_delta_occ.spark.session import local_delta_session
    from tests.spark.differential.harness import gate_session_conf
    from tests.spark.test_differential import SCENARIOS, _scenario_id

    lines = Lines()
    logger = logging.getLogger(WATCH_LOGGER)
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    scenarios = [s for s in SCENARIOS if _scenario_id(s).startswith(tuple(args.only.split(",")))]
    spark = local_delta_session("early-abort-pairs", conf={**gate_session_conf(), "spark.driver.memory": "6g"})
    work = Path(tempfile.mkdtemp(prefix="early_abort_pairs_"))
    outcomes: list[Outcome] = []
    began = time.monotonic()
    try:
        sources = {"merge": write_source(spark, str(work / "src_merge"), [(1, 1, 5)]),
                   "append": write_source(spark, str(work / "src_append"), [(101, 1, 0)], filler=args.rows)}
        bases: dict[tuple[bool, bool, str], str] = {}
        for scenario in scenarios:
            key = (scenario[2], scenario[3], scenario[4])
            if key not in bases and scenario[0] not in SKIPPED:
                bases[key] = str(work / f"base-{len(bases)}")
                build_base(spark, bases[key], *key, args.rows)
            outcome = replay(spark, scenario, bases.get(key, ""), work, sources, lines)
            outcomes.append(outcome)
            verdict = "not replayed" if not outcome.replayed else outcome.problems or "ok"
            print(f"{outcome.scenario}: {verdict} (stopped={outcome.stopped} after={outcome.stopped_after} "
                  f"kind={outcome.kind} attempts={outcome.attempts} {outcome.seconds} s)", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - began
    report = render(args, outcomes, seconds)
    print(report)
    bad = [o for o in outcomes if o.problems]
    if bad:
        print(f"{len(bad)} scenario(s) failed: {[o.scenario for o in bad]}", file=sys.stderr)
        sys.exit(1)
    if not args.no_write and not args.only:
        write_section("early-abort-pairs", "Early abort, pair by pair, on real delta-spark", report)


if __name__ == "__main__":
    main()
