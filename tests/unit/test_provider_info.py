"""The provider's info: valid against Airflow's own schema, and its how-to guides exist and are built."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from airflow_delta_occ.get_provider_info import get_provider_info

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_the_provider_info_is_valid_against_airflows_schema() -> None:
    import jsonschema
    from airflow import providers_manager

    schema = json.loads((Path(providers_manager.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_every_how_to_guide_exists_and_is_in_the_built_docs() -> None:
    """Issue #24: how-to pages linked from the provider info, as the official providers publish them; each
    is a page of the Sphinx project (docs/index.md's toctree), which `make docs` builds with warnings as errors."""
    guides = [guide for integration in get_provider_info()["integrations"]
              for guide in integration.get("how-to-guide", [])]
    assert guides
    toctree = set(re.findall(r"^(\S+)$", (REPO / "docs" / "index.md").read_text(), re.MULTILINE))
    for guide in guides:
        path = REPO / guide.lstrip("/")
        assert path.is_file(), guide
        assert path.relative_to(REPO / "docs").with_suffix("").as_posix() in toctree, guide
