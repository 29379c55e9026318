"""Spark's refusal of a statement, pointed into the argument the DAG author wrote (pure).

Spark reports where in *the statement* it stopped (``line 1 pos 91``), and the statement is the one the
provider rendered: the author's condition inside a MERGE with aliases, the injected partition
predicate and the clauses. A position there points at text the author never wrote; Delta's MERGE
refusals name the expression and list every column of both sides. The name that could not be
resolved is looked up in the operator's own arguments instead, and the message points at it there.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping

#: Spark's position in the rendered statement: "; line 1 pos 91" (analysis) or "(line 1, pos 12)" (parser).
_POSITION = re.compile(r"\s*;?\s*\(?\bline \d+,? pos \d+\)?", re.IGNORECASE)
#: Delta's MERGE refusal names the expression without quotes: "Cannot resolve s.no_such_column in search condition".
_DELTA_UNRESOLVED = re.compile(r"\bCannot resolve ([\w.]+) in\b")
#: A back-quoted, possibly qualified name as Spark prints it: `s`.`no_such_column`.
_QUOTED = re.compile(r"`(?:[^`]|``)*`(?:\.`(?:[^`]|``)*`)*")


def _unresolved_name(text: str) -> list[str]:
    """The parts of the name a refusal is about: Delta's "Cannot resolve s.x in search condition", else
    Spark's first back-quoted name (its suggestions come after it)."""
    delta = _DELTA_UNRESOLVED.search(text)
    if delta is not None:
        return delta.group(1).split(".")
    quoted = _QUOTED.search(text)
    if quoted is None:
        return []
    return [p.replace("``", "`") for p in re.findall(r"`((?:[^`]|``)*)`", quoted.group(0))]


def named_strings(value: object, name: str) -> Iterator[tuple[str, str]]:
    """Every string in ``value`` with where it is: ``merge_condition``, ``set['v']``, ``clauses[1]['condition']``
    (fields of dataclasses, keys and items of mappings and sequences)."""
    if isinstance(value, str):
        yield name, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from named_strings(getattr(value, field.name), field.name if not name else f"{name}.{field.name}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from named_strings(key, f"{name} (key)")
            yield from named_strings(item, f"{name}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from named_strings(item, f"{name}[{i}]")


def point_into_arguments(message: str, arguments: object) -> str:
    """``message`` without its position in the rendered statement, and, when the name it complains about is
    in one of ``arguments``' strings, a caret under it there."""
    text = _POSITION.sub("", message).rstrip()
    parts = _unresolved_name(text)
    if not parts or not all(part.strip() for part in parts):
        return text
    name = r"\s*\.\s*".join(rf"`?{re.escape(p)}`?" for p in parts)
    pattern = re.compile(rf"(?<![\w`.]){name}(?![\w`])", re.IGNORECASE)
    for where, value in named_strings(arguments, ""):
        found = pattern.search(value)
        if found is None:
            continue
        start = value.rfind("\n", 0, found.start()) + 1
        end = value.find("\n", found.start())
        line = value[start:] if end < 0 else value[start:end]
        prefix = f"  in {where}: "
        column = len(value[start:found.start()].expandtabs())   # the caret under the name as a terminal shows it
        return f"{text}\n{prefix}{line.expandtabs()}\n{' ' * (len(prefix) + column)}^"
    return text
