"""Triggers run in Airflow's triggerer: deferred tasks wait here without holding a worker slot.

Modules in this package are imported by the triggerer for every trigger it runs, so they import
only Airflow and light parts of this provider at module level; anything that loads the Delta
engine (and with it pyarrow) is imported inside ``run()``, off the event loop.
"""
