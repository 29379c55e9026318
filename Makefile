# One entry point for people and CI. `make test` is the README's test command and what .ci/run calls.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-unit test-spark test-airflow test-postgres test-s3 lint typecheck docs bench bench-headline bench-overhead bench-early-abort prove-early-abort bench-scale demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench,docs]'
	touch $(STAMP)

## Every tier: unit, spark (real local Spark + delta-spark), airflow (the Airflow CLI running example DAGs),
## postgres, then s3 (its own process: its Spark session carries the S3 connector), then lint, types and the
## docs (the API reference and guides, warnings as errors). Every test's duration lands in build/test-results/*.xml.
test: setup
	rm -rf build/test-results
	$(PY) -m pytest tests -m "not s3" --durations=40 --junitxml=build/test-results/main.xml
	$(PY) -m pytest tests -m s3 --durations=5 --junitxml=build/test-results/s3.xml
	$(MAKE) lint typecheck docs

test-unit: setup
	$(PY) -m pytest tests -m unit

test-spark: setup
	$(PY) -m pytest tests -m spark

test-airflow: setup
	$(PY) -m pytest tests -m airflow

test-postgres: setup
	$(PY) -m pytest tests -m postgres

test-s3: setup
	$(PY) -m pytest tests -m s3 --durations=5

lint: setup
	$(VENV)/bin/ruff check airflow_delta_occ tests benchmarks dags_examples

typecheck: setup
	$(VENV)/bin/mypy --strict airflow_delta_occ/engine
	$(VENV)/bin/mypy airflow_delta_occ

## The API reference (from the docstrings and the provider's info) and the guides, into build/docs; any warning fails.
docs: setup
	rm -rf build/docs
	# Importing Airflow for autodoc writes an Airflow home: a throwaway one, not ~/airflow.
	AIRFLOW_HOME=$$(mktemp -d) $(VENV)/bin/sphinx-build -E -W --keep-going -q -b html docs build/docs

bench: setup
	$(PY) benchmarks/snapshot_load.py
	$(PY) benchmarks/conflict_check.py
	$(PY) benchmarks/plan_footprint.py
	$(PY) benchmarks/leases.py

## K concurrent writers through a real Airflow, naive vs the provider (long: about 1 h per K=4/8 pair of tables).
bench-headline: setup
	$(PY) benchmarks/headline.py $(HEADLINE_ARGS)

bench-overhead: setup
	$(PY) benchmarks/overhead.py $(OVERHEAD_ARGS)

## A long MERGE doomed by a foreign commit, with and without early abort (about 10 minutes).
bench-early-abort: setup
	$(PY) benchmarks/early_abort.py $(EARLY_ABORT_ARGS)

## Every differential interleaving replayed with a long provider job and a foreign commit landing in it: stopped
## early exactly where delta-spark fails it, never where it commits; a table per pair in docs/benchmarks.md (~25 min).
prove-early-abort: setup
	$(PY) benchmarks/early_abort_pairs.py $(PAIRS_ARGS)

## Thousand-task backfills and faults on a Celery deployment (2 schedulers, 2 triggerers, 2 workers); long.
## Needs redis-server and PostgreSQL's server binaries (see .ci/run). SCALE_ARGS="--days 200 --writers 100" for less.
bench-scale: setup
	$(PY) benchmarks/scale.py $(SCALE_ARGS)

demo: setup
	$(PY) -m airflow_delta_occ.demo --dags-folder dags_examples

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
