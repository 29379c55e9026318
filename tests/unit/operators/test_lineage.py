"""OpenLineage dataset naming of Delta table locations, one case per scheme."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from airflow_delta_occ.exceptions import ProviderConfigError
from airflow_delta_occ.operators.lineage import DatasetName, dataset_name_for_location


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("/data/sales/", DatasetName("file", "/data/sales")),
        ("file:///data/sales", DatasetName("file", "/data/sales")),
        ("s3://bucket/warehouse/sales", DatasetName("s3://bucket", "warehouse/sales")),
        ("s3a://bucket/warehouse/sales/", DatasetName("s3://bucket", "warehouse/sales")),
        ("gs://bkt/sales", DatasetName("gs://bkt", "sales")),
        ("abfss://c@acct.dfs.core.windows.net/t/sales", DatasetName("abfss://c@acct.dfs.core.windows.net", "t/sales")),
        ("hdfs://nn:8020/user/hive/sales", DatasetName("hdfs://nn:8020", "user/hive/sales")),
    ],
)
def test_dataset_name_per_scheme(location: str, expected: DatasetName) -> None:
    assert dataset_name_for_location(location) == expected


def test_relative_path_becomes_absolute() -> None:
    assert dataset_name_for_location("rel/sales") == DatasetName("file", os.path.join(os.getcwd(), "rel/sales"))


@pytest.mark.parametrize("location", ["", "s3://", "ftp://host/x"])
def test_unnameable_location_raises(location: str) -> None:
    with pytest.raises(ProviderConfigError):
        dataset_name_for_location(location)


def test_module_does_not_import_openlineage_or_pyarrow() -> None:
    """The OpenLineage provider is optional and operators import in the scheduler: naming must stay light."""
    code = ("import sys, airflow_delta_occ.operators.lineage; "
            "print([m for m in ('pyarrow', 'openlineage', 'airflow.providers.openlineage') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
