"""Sphinx configuration: the API reference (from the docstrings) and the how-to guides (the Markdown pages).

Built by ``make docs`` (and ``make test``) with warnings as errors, so a docstring that does not render,
or a guide that links to nothing, fails CI.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "_ext")))

project = "airflow-delta-occ"
author = "airflow-delta-occ contributors"
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",     # the "Raises:" and "Returns:" sections of the docstrings
    "myst_parser",             # the guides are Markdown
    "provider_reference",      # connection types, configuration options and CLI, from the provider itself
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "alabaster"
# Type hints name classes of Airflow, pyspark and the standard library; the reference does not link them.
nitpicky = False
