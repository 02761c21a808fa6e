"""Manifest errors that name the file, line and column, as a compiler's do."""

from __future__ import annotations

from dataclasses import dataclass


class FieldError(ValueError):
    """A cross-field check failed at `path`, relative to the model that raised it.

    pydantic keeps the raised exception in the error's context, so the loader can point at the
    offending key rather than at the model that holds it.
    """

    def __init__(self, message: str, path: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True, slots=True)
class Diagnostic:
    file: str
    line: int  # 1-based
    column: int  # 1-based
    message: str
    path: str = ""  # the manifest key it is about, dotted ('runtime.max_batch_size'); '' for the file

    def as_dict(self) -> dict[str, str | int]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "path": self.path,
            "message": self.message,
        }

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: error: {self.message}"


def sort_key(d: Diagnostic) -> tuple[str, int, int, str]:
    return d.file, d.line, d.column, d.message


class ManifestError(Exception):
    """An invalid manifest. `str()` is one `file:line:col: error: message` line per problem."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = sorted(set(diagnostics), key=sort_key)
        super().__init__("\n".join(map(str, self.diagnostics)))

    @classmethod
    def at(cls, file: str, line: int, column: int, message: str, path: str = "") -> ManifestError:
        return cls([Diagnostic(file, line, column, message, path)])
