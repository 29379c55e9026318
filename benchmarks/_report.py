"""Write one benchmark's figures into its own marked section of docs/benchmarks.md."""

from __future__ import annotations

import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def write_section(marker: str, title: str, report: str) -> None:
    """Replace the text between ``<!-- marker:begin -->`` and ``<!-- marker:end -->`` (or append it)."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    block = f"{begin}\n{report}\n{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + f"\n\n## {title}\n\n" + block + "\n"
    DOC.write_text(text)
    print(f"wrote {DOC}", file=sys.stderr)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1), linear between the closest ranks."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def machine() -> str:
    """The machine and versions a figure was measured with, for the report's first line."""
    import os
    import platform

    import delta
    import pyspark
    from airflow import __version__ as airflow_version

    cpuinfo = Path("/proc/cpuinfo")
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")), platform.machine()) if cpuinfo.exists() else platform.machine()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB; Python {platform.python_version()}, Airflow "
            f"{airflow_version}, pyspark {pyspark.__version__}, delta-spark {getattr(delta, '__version__', '4.4.0')}")
