"""The demo's summary for a newcomer: what ran in parallel, what waited and why, conflicts avoided, the table.

Every line comes from what the parts recorded: Airflow's task instances, the pool's audit (told by
``PoolStory``), each task's job result (XCom), the Delta log (read by the engine, no Spark) and the
``check_table`` task, which read the table with Spark.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.planner import Footprint
from airflow_delta_occ.pools.compare import lease_verdict
from airflow_delta_occ.pools.story import LeaseSpan

from .scenario import DemoRun, task_rows

WIDTH = 56  # columns of the timeline


def _clock(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


def _partitions(fp: Footprint) -> set[str]:
    """The partitions a footprint reads or writes, as ``k=v,...`` text."""
    values = [*fp.read_files.values(), *(fp.write_partitions or ())]
    return {",".join(f"{k}={v}" for k, v in sorted(pv.items())) for pv in values}


def _name(run: DemoRun, span: LeaseSpan) -> str:
    return run.leases.get(span.request_id, span.owner)


def task_table(run: DemoRun, origin: float) -> list[str]:
    spans = {run.leases.get(s.request_id): s for s in run.story.spans}

    def at(value: float | None) -> str:
        return "-" if value is None else f"{value - origin:6.1f}"

    lines = [f"  {'task':<12} {'state':<8} {'tries':>5}  {'start':>6} {'lease':>6} {'end':>6}  "
             "(seconds from the first task's start; 'lease': when the pool granted it)"]
    for t in task_rows(run):
        span = spans.get(t["task_id"])
        lines.append(f"  {t['task_id']:<12} {t['state']:<8} {t.get('try_number') or 1:>5}  "
                     f"{at(_clock(t.get('start_date'))):>6} {at(span.granted_at if span else None):>6} "
                     f"{at(_clock(t.get('end_date'))):>6}")
    return lines


def timeline(run: DemoRun) -> list[str]:
    """One row per lease: '.' while it waited for the pool, '#' while it was held (the job ran)."""
    spans = [s for s in run.story.spans if s.request_id in run.leases]
    if not spans:
        return ["  (the pool recorded no lease)"]
    start = min(s.requested_at for s in spans)
    end = max(s.ended_at or s.granted_at or s.requested_at for s in spans)
    scale = WIDTH / max(end - start, 1e-9)

    def col(t: float) -> int:
        return min(WIDTH, max(0, round((t - start) * scale)))

    lines = []
    for s in spans:
        granted = s.granted_at if s.granted_at is not None else end
        ended = s.ended_at if s.ended_at is not None else end
        row = " " * col(s.requested_at) + "." * (col(granted) - col(s.requested_at))
        row += "#" * max(1, col(ended) - col(granted))
        lines.append(f"  {_name(run, s):<12}|{row:<{WIDTH}}|")
    lines.append(f"  {'':<12} 0 s{'':>{WIDTH - 8}}{end - start:.0f} s")
    return lines


def parallel_lines(run: DemoRun) -> list[str]:
    story = run.story
    beside: dict[str, list[str]] = {}
    for a, b in story.together:
        beside.setdefault(_name(run, a), []).append(_name(run, b))
        beside.setdefault(_name(run, b), []).append(_name(run, a))
    lines = [f"  at most {story.peak} writers held leases at the same time"]
    lines += [f"  {name:<12} ran beside {', '.join(sorted(others))}" for name, others in sorted(beside.items())]
    for a, b in story.together:
        if a.request is None or b.request is None:
            continue
        shared = _partitions(a.request.footprint) & _partitions(b.request.footprint)
        if shared:
            verdict = lease_verdict(a.request.planned, b.request.planned, a.request.model)
            lines.append(f"  {_name(run, a)} and {_name(run, b)} share partition {', '.join(sorted(shared))} and "
                         f"still ran together: {_relabel(run, verdict.reason)}")
    return lines


def _relabel(run: DemoRun, text: str) -> str:
    """A planner reason names jobs by their footprint label; the demo names them by task id."""
    for span in run.story.spans:
        if span.request is not None and span.request.footprint.label:
            text = text.replace(span.request.footprint.label, _name(run, span))
    return text


def serialized_lines(run: DemoRun) -> list[str]:
    if not run.story.waits:
        return ["  nobody waited: no two writers that were live together could conflict"]
    lines = []
    for w in run.story.waits:
        kind = w.verdict.exception.value if w.verdict.exception else "a conflict"
        lines.append(f"  {_name(run, w.waiter)} waited {w.waiter.waited or 0:.1f} s for {_name(run, w.ahead)}: "
                     f"together, Delta would have failed one of them with {kind}")
        lines.append(f"      why (the planner, from the two footprints): {_relabel(run, w.verdict.reason)}")
    return lines


def conflict_lines(run: DemoRun) -> list[str]:
    avoided = {frozenset((w.waiter.request_id, w.ahead.request_id)) for w in run.story.waits}
    raised = sum(len(r.conflicts) for r in run.results.values())
    retried = [t["task_id"] for t in run.outcome.tasks if int(t.get("try_number") or 1) > 1]
    attempts = {task: r.attempts for task, r in sorted(run.results.items())}
    return [f"  conflicts avoided by the pool: {len(avoided)} pair(s) of writers kept apart",
            f"  Delta conflict exceptions inside the jobs: {raised}; Spark attempts per job: "
            + ", ".join(f"{task} {n}" for task, n in attempts.items()),
            f"  task tries Airflow had to repeat: {len(retried)}" + (f" ({', '.join(retried)})" if retried else "")]


def commit_lines(run: DemoRun) -> list[str]:
    lines = []
    for commit in reversed(DeltaLog.for_table(run.table).history()):
        info = commit.commit_info
        if info is None:
            continue
        tag = json.loads(info.user_metadata).get("airflow", {}) if info.user_metadata else {}
        who = tag.get("task_id", "-")
        read = info.read_version
        note = (f"  (rebased over {commit.version - read - 1} concurrent commit(s), no conflict)"
                if read is not None and commit.version > read + 1 else "")
        shown = "-" if read is None else read
        lines.append(f"  v{commit.version:<3} {info.operation:<13} by {who:<12} read v{shown}{note}")
    return lines


def table_lines(run: DemoRun) -> list[str]:
    if run.checked is None:
        return ["  check_table did not report (see the task logs)"]
    lines = [f"  {'country':<8} {'rows':>5} {'sum(amount)':>12}"]
    lines += [f"  {country:<8} {int(rows):>5} {total:>12.1f}" for country, (rows, total) in run.checked.items()]
    lines.append("  equal, partition by partition, to what the six writers must leave in any commit order")
    return lines


def render(run: DemoRun) -> list[str]:
    """The whole summary, as lines."""
    starts = [c for t in run.outcome.tasks if (c := _clock(t.get("start_date"))) is not None]
    origin = min(starts) if starts else 0.0
    sections: Iterable[tuple[str, list[str]]] = (
        ("What ran (Airflow's task instances)", task_table(run, origin)),
        ("The writers' leases in conflict pool 'demo' ('.' waiting for the pool, '#' holding the lease "
         "while the Spark job ran)", timeline(run)),
        ("What ran in parallel", parallel_lines(run)),
        ("What was serialized, and why", serialized_lines(run)),
        ("Conflicts", conflict_lines(run)),
        ("Commits, from the Delta log (read by the engine, no Spark)", commit_lines(run)),
        (f"The final table {run.table} (check_table, read with Spark)", table_lines(run)),
    )
    out: list[str] = []
    for title, lines in sections:
        out += ["", title + ":", *lines]
    return out

