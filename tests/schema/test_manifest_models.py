"""The Manifest v1 models: documented fields, statuses, defaults and the cross-field rules."""

import subprocess
import sys

import pytest
from pydantic import BaseModel, ValidationError

from fastpath.schema import FMHA_LIBRARIES, Manifest, parse_manifest
from fastpath.schema.errors import FieldError
from fastpath.schema.reference import public_fields

MINIMAL = {"schema_version": 1, "name": "m", "model": {"checkpoint": "random:tiny-llama"}}


def with_(**sections):
    return {**MINIMAL, **sections}


def all_models(model=Manifest):
    yield model
    for field in model.model_fields.values():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from all_models(field.annotation)


def test_every_field_has_a_description_and_a_status():
    for record in public_fields():
        assert len(record.description) > 10, f"{record.path} has no description"
        assert record.status in {"stable", "prototype"}, record.path


def test_every_model_is_frozen_and_forbids_unknown_keys():
    manifest = Manifest.model_validate(MINIMAL)
    for model in all_models():
        assert model.model_config["frozen"] and model.model_config["extra"] == "forbid", model.__name__
        assert model.__doc__, model.__name__
    with pytest.raises(ValidationError):
        manifest.name = "other"


def test_a_minimal_manifest_takes_every_default():
    m = Manifest.model_validate(MINIMAL)
    assert m.runtime.device == "auto" and m.runtime.cuda_graphs.enabled == "auto"
    assert not m.hooks.loop_on_execution_stream and m.hooks.decode_prologue is None
    assert m.hooks.executor_events.after_warmup == () and m.fmha.enabled is None
    assert m.host_dispatch.mode == "auto" and m.guided_decoding.backend == "none"


def test_lists_become_tuples_and_tp_is_an_alias():
    m = Manifest.model_validate(with_(runtime={"tp": 1, "cuda_graphs": {"batch_sizes": [1, 2]}}))
    assert m.runtime.cuda_graphs.batch_sizes == (1, 2)
    assert m.runtime.tensor_parallel_size == 1


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (with_(runtime={"device": "cpu", "cuda_graphs": {"enabled": True}}), ("cuda_graphs", "enabled")),
        (
            with_(runtime={"max_batch_size": 2, "cuda_graphs": {"batch_sizes": [1, 4]}}),
            ("cuda_graphs", "batch_sizes", 1),
        ),
        (with_(runtime={"device": "cpu", "tp": 2}), ("tensor_parallel_size",)),
        (with_(fmha={"prepend": ["reference"], "enabled": ["sdpa_math", "reference"]}), ("enabled", 1)),
        (with_(hooks={"executor_events": {"at_shutdown": ["a:b", "a:b"]}}), ("at_shutdown", 1)),
        (
            with_(hooks={"loop_on_execution_stream": True}, guided_decoding={"backend": "llguidance"}),
            ("hooks", "loop_on_execution_stream"),
        ),
    ],
)
def test_cross_field_rules_name_the_key_to_blame(data, path):
    with pytest.raises(ValidationError) as caught:
        Manifest.model_validate(data)
    (error,) = caught.value.errors()
    assert isinstance(error["ctx"]["error"], FieldError)
    assert error["ctx"]["error"].path == path


@pytest.mark.parametrize("value", [1, 0, "true", "yes", None])
def test_cuda_graphs_enabled_takes_only_auto_true_or_false(value):
    with pytest.raises(ValidationError):
        Manifest.model_validate(with_(runtime={"cuda_graphs": {"enabled": value}}))


@pytest.mark.parametrize("value", [True, 1.0, "1", 2])
def test_schema_version_is_exactly_the_integer_one(value):
    with pytest.raises(ValidationError):
        Manifest.model_validate({**MINIMAL, "schema_version": value})


@pytest.mark.parametrize(
    "path",
    ["a.b:C", "a:b", "_x.y_2:Z9"],
)
def test_import_paths_that_are_accepted(path):
    Manifest.model_validate(with_(hooks={"decode_prologue": path}))


@pytest.mark.parametrize(
    "path",
    ["a.b.C", "a:b:c", "a.:b", ":b", "a:", "a.class:B", "a:None", "a:b.c", "ä:b", "a b:c", "a:b\n", "1a:b"],
)
def test_import_paths_that_are_refused(path):
    with pytest.raises(ValidationError):
        Manifest.model_validate(with_(hooks={"decode_prologue": path}))


@pytest.mark.parametrize("name", ["Upper", "1abc", "-a", "a b", "import", "json", "fastpath", "x" * 65, ""])
def test_names_that_cannot_be_packages_are_refused(name):
    with pytest.raises(ValidationError):
        Manifest.model_validate({**MINIMAL, "name": name})


def test_every_fmha_name_is_accepted_once():
    m = Manifest.model_validate(with_(fmha={"enabled": list(FMHA_LIBRARIES)}))
    assert m.fmha.enabled == FMHA_LIBRARIES


def test_yaml_keys_carry_their_lines():
    loaded = parse_manifest("schema_version: 1\nname: m\nmodel:\n  checkpoint: random:tiny-llama\n")
    assert loaded.line_of("model", "checkpoint") == 4 and loaded.line_of("hooks") is None


def test_schema_names_import_without_pydantic_and_nothing_imports_torch():
    # The runtime reads the names without pydantic; the compiler must stay free of torch.
    code = (
        "import sys\n"
        "sys.modules['pydantic'] = None\n"
        "from fastpath.schema.names import FMHA_LIBRARIES\n"
        "del sys.modules['pydantic']\n"
        "import fastpath.compiler, fastpath.schema.loader\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
