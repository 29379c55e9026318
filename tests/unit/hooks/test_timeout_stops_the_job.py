"""``execution_timeout`` unwinds through a running job as ``AirflowTaskTimeout`` (a BaseException), and
the Task SDK calls ``on_kill`` only after ``execute`` returned: the hook stops the job's Spark work on
the way out, or a spark-submit driver or the session's jobs would go on and could still commit.

The stopping itself is proven on real Spark in every mode by ``tests/spark/test_kill.py``; these tests
pin the decision of *when* to stop, with stand-ins that record the calls."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowTaskTimeout

import airflow_delta_occ.hooks.transports.submit as submit_transport
from airflow_delta_occ.hooks.delta import DeltaSparkHook


class _Context:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def addJobTag(self, tag: str) -> None:
        self.calls.append("tag")

    def removeJobTag(self, tag: str) -> None:
        pass

    def getLocalProperty(self, key: str) -> None:
        return None

    def setLocalProperty(self, key: str, value: Any) -> None:
        pass

    def setInterruptOnCancel(self, value: bool) -> None:
        pass

    def cancelJobsWithTag(self, tag: str) -> None:
        self.calls.append("cancel")


class _Session:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.sparkContext = _Context(self.calls)

    def stop(self) -> None:
        self.calls.append("stop")


@pytest.mark.parametrize(("raised", "stopped"), [(AirflowTaskTimeout, True), (KeyboardInterrupt, True),
                                                 (RuntimeError, False)])
def test_an_embedded_job_is_stopped_when_a_timeout_unwinds_through_it(raised: type[BaseException],
                                                                       stopped: bool) -> None:
    hook, session = DeltaSparkHook(None, mode="embedded"), _Session()
    with pytest.raises(raised), hook.transport._tracked(session):  # type: ignore[attr-defined]
        raise raised("while the MERGE ran")
    assert (session.calls == ["tag", "cancel", "stop"]) is stopped, session.calls
    assert hook._running is None


def test_a_spark_submit_driver_is_killed_when_a_timeout_unwinds_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[str] = []

    class _Submit:
        _name = "delta-occ-test"

        def __init__(self, **kwargs: Any) -> None:
            self.application, self.result, self.conflict = kwargs["application"], None, None

        def submit(self, application: str) -> None:
            raise AirflowTaskTimeout("execution_timeout")

        def on_kill(self) -> None:
            killed.append("driver")

    monkeypatch.setattr(submit_transport, "_submit_hook_class", lambda: _Submit)
    monkeypatch.setattr(DeltaSparkHook, "conf_with_storage", lambda self, base: {})
    from airflow_delta_occ.jobs.spec import JobSpec

    spec = JobSpec.from_json(_SPEC)
    with pytest.raises(AirflowTaskTimeout):
        DeltaSparkHook(None, mode="spark-submit").run(spec)
    assert killed == ["driver"]


_SPEC = ('{"operation": "delete", "target": {"path": "/lake/t"}, "run": {"dag_id": "d", "task_id": "t", '
         '"run_id": "r", "map_index": -1, "try_number": 1, "first_try": 1}, "condition": null}')
