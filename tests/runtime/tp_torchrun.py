"""Run by torchrun (2 processes) from test_tensor_parallel.py: every rank builds the engine; rank 0
generates and writes its tokens; rank 1's engine serves rank 0 until it closes, then yields nothing."""

import json
import sys

import torch.distributed as dist

from fastpath.runtime import LLM, SamplingParams

PROMPTS = [[1, 5, 9, 33, 7], [4], list(range(3, 30))]
MAX_TOKENS = 24

if __name__ == "__main__":
    llm = LLM("random:tiny-llama", device="cpu", max_seq_len=128, tp=2)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    llm.close()
    if dist.get_rank() == 1:
        with open(sys.argv[1] + ".rank1", "w") as f:
            json.dump(outputs, f)
    dist.barrier()
    if dist.get_rank() == 0:
        with open(sys.argv[1] + ".rank1") as f:
            rank1 = json.load(f)
        tokens = [o.outputs[0].token_ids for o in outputs]
        with open(sys.argv[1], "w") as f:
            json.dump(
                {"prompts": PROMPTS, "max_tokens": MAX_TOKENS, "tokens": tokens, "rank1_outputs": rank1}, f
            )
