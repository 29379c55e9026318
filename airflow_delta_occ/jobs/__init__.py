"""The job layer, pure (no Airflow, no Spark): what a Delta job is and what it returned.

``spec`` (``JobSpec``), ``result`` (``JobResult``), ``partitions`` (typed partition predicates),
``checks`` (argument checks), ``queries`` (source queries), ``sql`` (statements built from parse
trees). The operators build a ``JobSpec``; the runner executes it and returns a ``JobResult``.
"""
