"""The committed schema files follow the models: JSON Schema, API reference, human reference."""

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from fastpath.schema import export
from fastpath.schema.reference import public_fields

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.mark.parametrize(
    "path", [export.SCHEMA_FILE, export.REFERENCE_FILE, export.MARKDOWN_FILE], ids=lambda p: p.name
)
def test_committed_file_matches_the_models(path):
    expected = export.expected_files()[path]
    assert path.is_file(), f"{path} is missing; run `{export.REGENERATE}`"
    assert path.read_text(encoding="utf-8") == expected, (
        f"{path} is out of date with fastpath/schema/models.py; run `{export.REGENERATE}` and review the diff"
    )


def test_the_api_reference_lists_every_public_field_with_its_annotation_default_and_status():
    reference = yaml.safe_load(export.REFERENCE_FILE.read_text(encoding="utf-8"))["fields"]
    for record in public_fields():
        entry = reference[record.path]
        assert (entry["annotation"], entry["default"], entry["status"]) == (
            record.annotation,
            record.default,
            record.status,
        )
    assert len(reference) == len(public_fields())


def test_the_export_check_fails_on_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "manifest.schema.json"
    stale.write_text("{}\n", encoding="utf-8")
    monkeypatch.setattr(export, "SCHEMA_FILE", stale)
    assert export.main(["--check"]) == 1
    assert export.REGENERATE in capsys.readouterr().err


def test_examples_validate_against_the_committed_json_schema():
    schema = json.loads(export.SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    assert EXAMPLES
    for example in EXAMPLES:
        jsonschema.validate(yaml.safe_load(example.read_text(encoding="utf-8")), schema)


def test_the_json_schema_refuses_what_the_models_refuse():
    schema = json.loads(export.SCHEMA_FILE.read_text(encoding="utf-8"))
    base = {"schema_version": 1, "name": "m", "model": {"checkpoint": "random:tiny-llama"}}
    jsonschema.validate({**base, "runtime": {"tp": 2}}, schema)
    for bad in [
        {**base, "runtime": {"max_batch": 8}},
        {**base, "runtime": {"tp": 2, "tensor_parallel_size": 2}},
        {**base, "fmha": {"prepend": ["flex"]}},
        {**base, "hooks": {"decode_prologue": "a.b"}},
        {**base, "name": "Bad Name"},
        {**base, "schema_version": 2},
    ]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


@pytest.mark.parametrize(
    ("good", "bad"),
    [
        ({"runtime": {"cuda_graphs": {"batch_sizes": [1, 2]}}}, {"runtime": {"cuda_graphs": {"batch_sizes": [1, 1]}}}),
        ({"fmha": {"prepend": ["sdpa_flash"]}}, {"fmha": {"prepend": ["sdpa_flash", "sdpa_flash"]}}),
        ({"fmha": {"enabled": ["sdpa_math"]}}, {"fmha": {"enabled": ["sdpa_math", "sdpa_math"]}}),
        ({"hooks": {"executor_events": {"at_shutdown": ["a:b"]}}},
         {"hooks": {"executor_events": {"at_shutdown": ["a:b", "a:b"]}}}),
        ({"model": {"checkpoint": "models/a b"}}, {"model": {"checkpoint": " \u3000"}}),
        ({"model": {"checkpoint": "models/a b"}}, {"model": {"checkpoint": "models/a\tb"}}),
        ({"serve": {"served_model_name": "a b"}}, {"serve": {"served_model_name": "\u00a0"}}),
    ],
)  # fmt: skip
def test_what_the_json_schema_can_say_of_the_models_item_and_string_rules_it_says(good, bad):
    """Lists whose items the models take once, and strings they refuse blank or holding a control
    character: the schema refuses them too, and takes the good twin."""
    from fastpath.schema import ManifestError, parse_manifest

    schema = json.loads(export.SCHEMA_FILE.read_text(encoding="utf-8"))
    base = {"schema_version": 1, "name": "m", "model": {"checkpoint": "random:tiny-llama"}}
    jsonschema.validate({**base, **good}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**base, **bad}, schema)
    with pytest.raises(ManifestError):
        parse_manifest(json.dumps({**base, **bad}), "m.yaml")


def test_examples_point_editors_at_the_schema_and_pre_commit_checks_them():
    for example in EXAMPLES:
        first = example.read_text(encoding="utf-8").splitlines()[0]
        assert first == "# yaml-language-server: $schema=../schema/manifest.schema.json", example.name
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    (hook,) = [h for repo in config["repos"] for h in repo["hooks"] if h["id"] == "check-jsonschema"]
    assert hook["args"] == ["--schemafile", "schema/manifest.schema.json"]
    assert all(re.match(hook["files"], e.relative_to(REPO).as_posix()) for e in EXAMPLES)
