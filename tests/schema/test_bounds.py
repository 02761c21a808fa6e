"""The schema accepts exactly what the runtime accepts: fastpath.vocab.bound_cases(), run as manifests.

The runtime's tests run the same cases through its argument checks, so the two sides cannot drift.
"""

import pytest
import yaml

from fastpath.schema import ManifestError, parse_manifest
from fastpath.vocab import bound_cases

# LLM keyword -> where a manifest says it
MANIFEST_KEYS = {
    "max_batch_size": ("runtime", "max_batch_size"),
    "max_seq_len": ("runtime", "max_seq_len"),
    "seed": ("model", "seed"),
    "tensor_parallel_size": ("runtime", "tensor_parallel_size"),
    "fmha_enabled": ("fmha", "enabled"),
}


def manifest_with(kwargs: dict) -> str:
    data = {"schema_version": 1, "name": "bounds", "model": {"checkpoint": "random:tiny-llama"}}
    for key, value in kwargs.items():
        section, field = MANIFEST_KEYS[key]
        data.setdefault(section, {})[field] = list(value) if isinstance(value, tuple) else value
    return yaml.safe_dump(data)


@pytest.mark.parametrize(("kwargs", "accepted"), bound_cases(), ids=repr)
def test_the_schema_accepts_what_the_runtime_accepts(kwargs, accepted):
    text = manifest_with(kwargs)
    if accepted:
        parse_manifest(text, "bounds.yaml")
        return
    with pytest.raises(ManifestError) as caught:
        parse_manifest(text, "bounds.yaml")
    ((key, _),) = kwargs.items()
    assert ".".join(MANIFEST_KEYS[key]) in str(caught.value)


def test_every_bound_has_a_manifest_key():
    assert {key for kwargs, _ in bound_cases() for key in kwargs} == set(MANIFEST_KEYS)
