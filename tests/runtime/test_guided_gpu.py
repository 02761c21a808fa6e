"""llguidance on a CUDA device: its Python fill as the host callback captured in the decode graphs.

xgrammar's C++ fill has its own file (test_gpu_guided.py); this is the path every backend without
it takes, per dispatch mode.
"""

import json

import jsonschema
import pytest
from guided_cases import CHOICES, PROMPTS, SCHEMAS

from fastpath.runtime import LLM, SamplingParams

pytestmark = pytest.mark.gpu
pytest.importorskip("llguidance")


def _run(mode):
    with LLM("random:tiny-llama", device="cuda", dtype="bfloat16", max_seq_len=320, max_batch_size=8,
             graph_batch_sizes=list(range(1, 9)), guided_backend="llguidance", dispatch_mode=mode) as llm:  # fmt: skip
        assert llm.executor.guided.fill == "python"
        kinds = {k for _, k in llm.executor.graphs.graphs}
        assert {"guided_greedy", "guided_general"} <= kinds, f"guided decode graphs were captured: {kinds}"
        results = {}
        for name, schema in SCHEMAS.items():
            params = [
                SamplingParams(max_tokens=200, temperature=1.0, seed=s, guided={"json_schema": schema})
                for s in range(4)
            ]
            results[name] = [
                (o.outputs[0].text, o.outputs[0].finish_reason) for o in llm.generate(PROMPTS, params)
            ]
        choice = [
            SamplingParams(max_tokens=40, temperature=1.0, seed=s, guided={"choice": CHOICES})
            for s in range(4)
        ]
        results["choice"] = [
            (o.outputs[0].text, o.outputs[0].finish_reason) for o in llm.generate(PROMPTS, choice)
        ]
        return results


def test_llguidance_outputs_validate_under_graphs_and_agree_across_dispatch_modes():
    by_mode = {mode: _run(mode) for mode in ("blocking", "spin")}
    for mode, results in by_mode.items():
        for name, schema in SCHEMAS.items():
            finished = [t for t, r in results[name] if r == "stop"]
            assert len(finished) >= 3, f"{mode}/{name}: {results[name]}"
            for text in finished:
                jsonschema.validate(json.loads(text), schema)
        assert all(r == "stop" and t in CHOICES for t, r in results["choice"]), results["choice"]
    assert by_mode["blocking"] == by_mode["spin"]
