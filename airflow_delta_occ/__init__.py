"""airflow-delta-occ: concurrent writes to Delta Lake tables from Apache Airflow, safely and fast.

Importing the package is cheap and imports neither Airflow nor Spark; the Airflow-facing modules
(operators, hooks, sensors) import Airflow themselves.
"""

__version__ = "0.1.0.dev0"
