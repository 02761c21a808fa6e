"""Manifest files -> validated `Manifest`, with every error as `file:line:col: error: message`."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from pydantic import ValidationError

from .diagnose import diagnostics
from .errors import ManifestError
from .models import Manifest
from .yaml_source import MAX_BYTES, YamlDocument, read_yaml


@dataclass(frozen=True, slots=True)
class LoadedManifest:
    """A validated manifest and where it came from: its file, its bytes' sha256 and its YAML positions."""

    manifest: Manifest
    filename: str
    sha256: str
    document: YamlDocument

    def line_of(self, *path: str | int) -> int | None:
        """The line a key (or a list item) is written on, or None when the manifest leaves it out."""
        mark = self.document.keys.get(path) or self.document.values.get(path)
        return mark[0] if mark else None


def load_manifest(path: str | os.PathLike[str]) -> LoadedManifest:
    """Read and validate a manifest file. Raises ManifestError."""
    filename = os.fspath(path)
    try:
        with open(filename, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ManifestError.at(filename, 1, 1, f"cannot read the manifest: {exc.strerror}") from None
    if len(data) > MAX_BYTES:
        raise ManifestError.at(
            filename, 1, 1, f"the file is over {MAX_BYTES // (1 << 20)} MiB; a manifest is small"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ManifestError.at(filename, line, column, "the manifest is not UTF-8") from None
    return parse_manifest(text, filename, hashlib.sha256(data).hexdigest())


def parse_manifest(text: str, filename: str = "<manifest>", sha256: str | None = None) -> LoadedManifest:
    """Validate manifest text; `sha256` defaults to that of its UTF-8 bytes. Raises ManifestError."""
    if len(text) > MAX_BYTES:
        raise ManifestError.at(
            filename, 1, 1, f"the text is over {MAX_BYTES // (1 << 20)} MiB; a manifest is small"
        )
    document = read_yaml(text, filename)
    try:
        manifest = Manifest.model_validate(document.data)
    except ValidationError as exc:
        raise ManifestError(diagnostics(exc, document, filename)) from None
    digest = sha256 or hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return LoadedManifest(manifest, filename, digest, document)
