"""Sphinx directives that render the reference from the provider itself, so it cannot drift from the code.

* ``provider-connections``: each connection type of ``get_provider_info()`` with its form fields;
* ``provider-configuration``: every ``[delta_occ]`` option with its type, default and example;
* ``provider-cli``: every ``airflow delta-occ`` command with its arguments, from the CLI declarations.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


class _Rendered(SphinxDirective):
    """A directive whose content is reStructuredText built from the provider, parsed in place (headings are
rubrics: a directive's content cannot open sections)."""

    def lines(self) -> Iterable[str]:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        container = nodes.container()
        self.state.nested_parse(StringList(list(self.lines()), source="provider"), self.content_offset, container)
        return list(container.children)


def _info() -> dict[str, Any]:
    from airflow_delta_occ.get_provider_info import get_provider_info

    return get_provider_info()


def _literal(value: object) -> str:
    text = str(value).replace("``", "` `")
    return f"``{text}``" if text else "(empty)"


class Connections(_Rendered):
    def lines(self) -> Iterable[str]:
        for conn in _info()["connection-types"]:
            yield from (f".. rubric:: ``{conn['connection-type']}``: {conn['hook-name']}", "",
                        f"Hook: :class:`{conn['hook-class-name']}`", "")
            behaviour = conn.get("ui-field-behaviour") or {}
            if behaviour.get("hidden-fields"):
                yield f"Hidden standard fields: {', '.join(_literal(f) for f in behaviour['hidden-fields'])}."
                yield ""
            for field, label in sorted((behaviour.get("relabeling") or {}).items()):
                yield f"* standard field {_literal(field)} is shown as \"{label}\""
            for field, text in sorted((behaviour.get("placeholders") or {}).items()):
                yield f"* placeholder of {_literal(field)}: {_literal(text)}"
            yield ""
            fields = conn.get("conn-fields") or {}
            if fields:
                yield from (".. list-table:: Extra fields", "   :header-rows: 1", "",
                            "   * - field", "     - label", "     - type", "     - default", "     - description")
                for name, spec in fields.items():
                    schema = spec.get("schema") or {}
                    kind = schema.get("type")
                    kinds = ", ".join(kind) if isinstance(kind, list) else str(kind or "")
                    enum = schema.get("enum")
                    if enum:
                        kinds += f" (one of {', '.join(str(e) for e in enum)})"
                    yield from (f"   * - {_literal(name)}", f"     - {spec.get('label', '')}", f"     - {kinds}",
                                f"     - {_literal(schema['default']) if 'default' in schema else ''}",
                                f"     - {spec.get('description', '')}")
                yield ""


class Configuration(_Rendered):
    def lines(self) -> Iterable[str]:
        for section, spec in _info()["config"].items():
            yield from (f"Section ``[{section}]``: {spec['description']}", "")
            for name, option in spec["options"].items():
                yield from (f".. rubric:: ``{name}``", "",
                            option["description"], "",
                            f"* type: {option.get('type', 'string')}",
                            f"* default: {_literal(option.get('default', ''))}",
                            f"* example: {_literal(option.get('example', ''))}",
                            f"* environment: ``AIRFLOW__{section.upper()}__{name.upper()}``",
                            f"* added in: {option.get('version_added', '')}", "")


class Cli(_Rendered):
    def lines(self) -> Iterable[str]:
        from airflow_delta_occ.cli import get_provider_cli_definitions

        for command in get_provider_cli_definitions():
            yield from self._command(command, ["airflow"])

    def _command(self, command: Any, parents: list[str]) -> Iterable[str]:
        path = [*parents, command.name]
        subcommands = getattr(command, "subcommands", None)
        if subcommands:
            for sub in subcommands:
                yield from self._command(sub, path)
            return
        yield from (f".. rubric:: ``{' '.join(path)}``", "", str(command.help), "")
        if getattr(command, "description", None):
            yield from (str(command.description), "")
        for arg in command.args:
            flags = ", ".join(f"``{f}``" for f in arg.flags)
            kwargs = getattr(arg, "kwargs", {})
            help_text = str(kwargs.get("help") or "").replace("*", r"\*")
            yield f"* {flags}: {help_text}"
        yield ""


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("provider-connections", Connections)
    app.add_directive("provider-configuration", Configuration)
    app.add_directive("provider-cli", Cli)
    return {"parallel_read_safe": True, "version": "1"}
