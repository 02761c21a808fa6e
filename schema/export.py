"""Write or check the schema's committed files: `python -m fastpath.schema.export [--check]`.

- schema/manifest.schema.json: the JSON Schema of Manifest v1 (editors, check-jsonschema);
- schema/api_reference.yaml: each public field's annotation, default and status;
- docs/api/manifest.md: the human reference, when run from a source checkout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .models import Manifest
from .reference import reference_markdown, reference_yaml

SCHEMA_DIR = Path(__file__).resolve().parent
SCHEMA_FILE = SCHEMA_DIR / "manifest.schema.json"
REFERENCE_FILE = SCHEMA_DIR / "api_reference.yaml"
# docs/ sits beside schema/ in a checkout; an installed package has no docs to keep.
DOCS_DIR = SCHEMA_DIR.parent / "docs"
MARKDOWN_FILE = DOCS_DIR / "api" / "manifest.md"
REGENERATE = "python -m fastpath.schema.export"


def json_schema_text() -> str:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **Manifest.model_json_schema()}
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def expected_files() -> dict[Path, str]:
    files = {SCHEMA_FILE: json_schema_text(), REFERENCE_FILE: reference_yaml()}
    if DOCS_DIR.is_dir():
        files[MARKDOWN_FILE] = reference_markdown()
    return files


def stale_files() -> list[Path]:
    """Committed files that differ from what the models export now."""
    return [
        path
        for path, text in expected_files().items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file is out of date")
    args = parser.parse_args(argv)
    stale = stale_files()
    if args.check:
        for path in stale:
            print(f"{path}: out of date; run `{REGENERATE}`", file=sys.stderr)
        return 1 if stale else 0
    files = expected_files()
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path], encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
