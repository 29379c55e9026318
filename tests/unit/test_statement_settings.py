"""``spark.statements.pinned_settings`` when a session will not take a setting (issue #20).

A Spark Connect server can fix a setting (a static conf, or a server that refuses changes): the
provider cannot run its statements with the meaning it rendered, so it refuses before anything runs
and names the setting. No real server can be made to refuse these runtime settings, so the session
here is a stand-in for its ``conf`` alone; the pinning itself is proven on real Spark in
tests/spark/test_statement_text.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_delta_occ.exceptions import SessionSettingError
from airflow_delta_occ.spark.statements import STATEMENT_SETTINGS, pinned_settings

pytestmark = pytest.mark.unit


class _Conf:
    def __init__(self, values: dict[str, str], fixed: dict[str, str] | None = None, refuse: str | None = None):
        self.values, self.fixed, self.refuse = dict(values), dict(fixed or {}), refuse
        self.changed: list[str] = []

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def set(self, key: str, value: str) -> None:
        self.changed.append(key)
        if key == self.refuse:
            raise RuntimeError(f"[CANNOT_MODIFY_CONFIG] Cannot modify the value of the Spark config: {key}")
        self.values[key] = self.fixed.get(key, value)

    def unset(self, key: str) -> None:
        self.changed.append(key)
        self.values.pop(key, None)


class _Session:
    def __init__(self, conf: _Conf) -> None:
        self.conf = conf


def test_a_setting_the_server_refuses_stops_the_job_and_names_it() -> None:
    session = _Session(_Conf({"spark.sql.variable.substitute": "true"}, refuse="spark.sql.variable.substitute"))
    with pytest.raises(SessionSettingError, match=r"spark\.sql\.variable\.substitute=true.*CANNOT_MODIFY_CONFIG"):
        with pinned_settings(session):
            pytest.fail("the block ran")


def test_a_setting_the_session_silently_keeps_stops_the_job() -> None:
    conf = _Conf({}, fixed={"spark.sql.parser.escapedStringLiterals": "true"})
    with pytest.raises(SessionSettingError, match=r"escapedStringLiterals=true.*escapedStringLiterals=false"):
        with pinned_settings(_Session(conf)):
            pytest.fail("the block ran")
    assert "spark.sql.variable.substitute" not in conf.values  # what it set before the refusal is undone


def test_the_sessions_own_values_come_back_after_the_block() -> None:
    conf = _Conf({"spark.sql.ansi.enabled": "false", "spark.sql.session.timeZone": "Asia/Tokyo"})
    with pinned_settings(_Session(conf)):
        assert all(conf.values[k] == v for k, v in STATEMENT_SETTINGS.items())
    assert conf.values == {"spark.sql.ansi.enabled": "false", "spark.sql.session.timeZone": "Asia/Tokyo"}


def test_a_session_already_at_the_values_is_not_touched() -> None:
    """Spark warns on every set or unset of a deprecated setting (escapedStringLiterals): a job whose
    session already holds the values changes, and restores, nothing."""
    conf = _Conf(dict(STATEMENT_SETTINGS))
    with pinned_settings(_Session(conf)):
        pass
    assert conf.changed == [] and conf.values == dict(STATEMENT_SETTINGS)
