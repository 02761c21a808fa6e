"""Diagnostics as a person, GitHub Actions or another tool reads them (`--format text|github|json`)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from fastpath.schema.errors import Diagnostic

FORMATS = ("text", "github", "json")


def render_diagnostics(diagnostics: Sequence[Diagnostic], fmt: str) -> str:
    """The diagnostics in `fmt`, ending in a newline; '' when there are none (json: '[]')."""
    if fmt == "json":
        return json.dumps([d.as_dict() for d in diagnostics], indent=2, ensure_ascii=False) + "\n"
    if fmt == "github":
        return "".join(github_command(d) + "\n" for d in diagnostics)
    return "".join(f"{d}\n" for d in diagnostics)


def github_command(d: Diagnostic) -> str:
    """A workflow command: the error shows on the pull request's diff, at the line and column."""
    props = f"file={_property(d.file)},line={d.line},col={d.column},title={_property('fastpath manifest')}"
    return f"::error {props}::{_data(d.message)}"


def _data(text: str) -> str:
    # GitHub's escaping for a command's message, and more for its properties.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")
