"""The runtime's argument checks accept exactly what the manifest schema accepts: one list of cases
(fastpath.vocab.bound_cases) runs through both."""

import pytest

from fastpath.runtime.engine.options import engine_config, parse_options
from fastpath.runtime.model.presets import resolve_random
from fastpath.vocab import bound_cases


@pytest.mark.parametrize(("kwargs", "accepted"), bound_cases(), ids=lambda v: repr(v))
def test_the_runtime_takes_what_the_schema_takes(kwargs, accepted):
    # Positions enough for any length the bounds admit: the model's own limit is tested on its own.
    cfg = resolve_random("random:tiny-llama").replace(max_position_embeddings=1 << 30)
    options = parse_options({"device": "cpu", **kwargs})
    if accepted:
        engine_config(cfg, None, options)
    else:
        with pytest.raises(ValueError):
            engine_config(cfg, None, options)
