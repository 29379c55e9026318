"""What ``airflow delta-occ check`` found, typed: the pairs of Delta tasks that can conflict, what keeps each
pair apart (or what would), and the tasks it could not judge. Pure: no Airflow, no Spark.

A pair is reported only when the planner says the two jobs can conflict; a pair it cannot judge is never
reported as safe: its task is listed under ``unknown`` with the reason, and ``exit_code`` can count it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

EXIT_OK = 0
EXIT_UNPROTECTED = 1


@dataclass(frozen=True, order=True)
class TaskRef:
    """One task instance of a sample run: ``run`` is the run's label (its date, or ``next`` for the run after)."""

    dag_id: str
    task_id: str
    map_index: int = -1
    run: str = ""

    def __str__(self) -> str:
        index = f"[{self.map_index}]" if self.map_index >= 0 else ""
        run = f" ({self.run})" if self.run else ""
        return f"{self.dag_id}.{self.task_id}{index}{run}"

    def to_json(self) -> dict[str, Any]:
        return {"dag_id": self.dag_id, "task_id": self.task_id, "map_index": self.map_index, "run": self.run}


class Separation(enum.StrEnum):
    """What keeps two task instances from running at the same time."""

    DEPENDENCY = "dependency"            # one is upstream of the other in the same run
    CONFLICT_POOL = "conflict_pool"      # the same conflict pool: its leases serialize the pair
    AIRFLOW_POOL = "airflow_pool"        # the same Airflow pool of one slot
    TASK_LIMIT = "task_limit"            # max_active_tis_per_dag(run) = 1, max_active_tasks = 1


@dataclass(frozen=True)
class KeptApart:
    """Why a pair never runs at the same time: the kind and the facts (``"merge_p1 >> update_p1"``)."""

    by: Separation
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"by": self.by.value, "detail": self.detail}


@dataclass(frozen=True)
class Outcome:
    """One commit order of a pair: when ``winner`` commits first, ``loser``'s commit fails with ``exception``
    (``ConcurrentAppendException`` ...; ``None`` for a failure without a Delta exception), for ``reason``.
    ``exact``: delta-spark's check on the table as both were planned fails it (the planner's exact verdict);
    otherwise it fails only once other commits add files where both work (the pools' lifted verdict)."""

    winner: TaskRef
    loser: TaskRef
    exception: str | None
    reason: str
    exact: bool = True   # False: it fails only once other commits add files where both work (see ``reason``)

    def to_json(self) -> dict[str, Any]:
        return {"winner": self.winner.to_json(), "loser": self.loser.to_json(), "exception": self.exception,
                "reason": self.reason, "on_the_table_as_it_is": self.exact}


@dataclass(frozen=True)
class ConflictingPair:
    """Two task instances that can run at the same time on one table and can conflict, in the commit orders
    ``outcomes`` lists; ``kept_apart`` is ``None`` when nothing keeps them apart, and then ``advice`` says what
    would."""

    a: TaskRef
    b: TaskRef
    table: str
    outcomes: tuple[Outcome, ...]
    kept_apart: KeptApart | None
    advice: str | None = None

    @property
    def protected(self) -> bool:
        return self.kept_apart is not None

    @property
    def exceptions(self) -> tuple[str, ...]:
        """The exceptions Delta would raise, in either commit order, each once."""
        return tuple(sorted({o.exception for o in self.outcomes if o.exception is not None}))

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a.to_json(), "b": self.b.to_json(), "table": self.table, "exceptions": list(self.exceptions),
                "outcomes": [o.to_json() for o in self.outcomes], "protected": self.protected,
                "kept_apart_by": None if self.kept_apart is None else self.kept_apart.to_json(),
                "advice": self.advice}


@dataclass(frozen=True)
class UnknownTask:
    """A Delta task the check could not judge (its arguments did not render, its table could not be read):
    never counted as safe."""

    task: TaskRef
    reason: str
    table: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task.to_json(), "table": self.table, "reason": self.reason}


@dataclass(frozen=True)
class CheckReport:
    """Everything one check found. ``disjoint`` counts the pairs on a shared table the planner judged unable to
    conflict; ``judged`` the Delta task instances it planned; ``notes`` what it did not look at, and why."""

    dags: tuple[str, ...]
    runs: tuple[str, ...]
    judged: int
    conflicts: tuple[ConflictingPair, ...]
    disjoint: int
    unknown: tuple[UnknownTask, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def unprotected(self) -> tuple[ConflictingPair, ...]:
        return tuple(pair for pair in self.conflicts if not pair.protected)

    def exit_code(self, *, fail_on_unknown: bool = False) -> int:
        """1 when a pair can conflict unprotected (or, with ``fail_on_unknown``, a task could not be judged)."""
        if self.unprotected or (fail_on_unknown and self.unknown):
            return EXIT_UNPROTECTED
        return EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {"dags": list(self.dags), "runs": list(self.runs), "judged_tasks": self.judged,
                "unprotected": len(self.unprotected), "conflicts": [pair.to_json() for pair in self.conflicts],
                "disjoint_pairs": self.disjoint, "unknown": [task.to_json() for task in self.unknown],
                "notes": list(self.notes)}

    def text(self) -> str:
        """The report for a terminal: unprotected pairs first, then protected ones, then the unknown tasks."""
        lines = [f"checked {self.judged} Delta task instance(s) of {', '.join(self.dags) or 'no DAG'} "
                 f"(runs: {', '.join(self.runs)})"]
        for title, pairs in (("CAN CONFLICT, NOTHING KEEPS THEM APART", self.unprotected),
                             ("can conflict, kept apart", [p for p in self.conflicts if p.protected])):
            if pairs:
                lines += ["", f"{title} ({len(pairs)}):"]
            for pair in pairs:
                lines.append(f"  {pair.a}  x  {pair.b}   on {pair.table}")
                for o in pair.outcomes:
                    lines.append(f"      {o.winner.task_id} first: {o.loser.task_id} fails with "
                                 f"{o.exception or 'a conflict'}: {o.reason}")
                if pair.kept_apart is not None:
                    lines.append(f"      kept apart by {pair.kept_apart.by.value}: {pair.kept_apart.detail}")
                elif pair.advice:
                    lines.append(f"      to keep them apart: {pair.advice}")
        if self.unknown:
            lines += ["", f"NOT JUDGED, never counted as safe ({len(self.unknown)}):"]
            lines += [f"  {task.task}: {task.reason}" for task in self.unknown]
        lines += ["", f"{len(self.unprotected)} unprotected and {len(self.conflicts) - len(self.unprotected)} "
                      f"protected pair(s) can conflict; {self.disjoint} pair(s) on a shared table cannot"]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)
