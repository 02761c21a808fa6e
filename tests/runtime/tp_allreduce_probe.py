"""One tensor-parallel engine in a fresh process (the first in its process takes the symmetric-memory
path): prints its all-reduce path and greedy tokens as JSON. Used by test_gpu_tensor_parallel.py.

    python tp_allreduce_probe.py MODEL MODE HIDDEN PROMPT_LENS...
"""

import json
import sys

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.model.presets import PRESETS


def prompts_of(lens: list[int]) -> list[list[int]]:
    """Prompts of these lengths, in every model's vocabulary (the tiny ones have 512 ids)."""
    return [[3 + j % 500 for j in range(n)] for n in lens]


def main() -> None:
    model, mode, hidden, *lens = sys.argv[1:]
    if model == "wide":  # hidden 256 in fp32: long prefill chunks pass the one-shot's 512 KiB
        model = PRESETS["tiny-llama"].replace(
            hidden_size=int(hidden), head_dim=int(hidden) // 4, random_seed=3
        )
    prompts = prompts_of([int(n) for n in lens])
    kw = dict(device="cuda", dtype="float32", max_seq_len=2048, max_batch_size=4, tp=2, tp_allreduce=mode)
    with LLM(model, **kw) as llm:
        out = llm.generate(
            prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False
        )
        tp = llm.parallel.tp
        print(json.dumps({
            "fast": tp.fast is not None, "max_bytes": tp.fast.max_bytes if tp.fast else 0,
            "path": tp.allreduce_path, "tokens": [o.outputs[0].token_ids for o in out],
        }))  # fmt: skip


if __name__ == "__main__":
    main()
