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
