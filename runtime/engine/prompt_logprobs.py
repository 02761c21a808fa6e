"""prompt_logprobs: how likely the model found each prompt token, with the top-k at each position.

Computed by one extra prefill of the prompt outside the scheduler (on the engine's loop thread),
so the batched prefill path stays free of per-position work. The first position has no logprob
(nothing precedes it), as in vLLM.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..runner.kv_cache import CacheFullError
from .detokenizer import token_text
from .outputs import Logprob, PositionLogprobs

_CHUNK = 256  # positions per log-softmax, to bound the temporary [rows, vocab] memory
WAIT_FOR_BLOCKS_S = 30.0  # a full KV cache frees blocks as running requests finish
_RETRY_S = 0.01


def prompt_logprobs_when_room(
    core: Any, executor: Any, ids: list[int], k: int, tokenizer: Any, lora: Any = None,
    wait_s: float = WAIT_FOR_BLOCKS_S,
) -> list[PositionLogprobs | None]:  # fmt: skip
    """`prompt_logprobs` on the engine's loop thread, waiting (off that thread) while the KV cache has
    no room for the prompt's blocks, or no LoRA slot for its adapter; a TimeoutError naming the wait
    after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return core.call(lambda: prompt_logprobs(executor, ids, k, tokenizer, lora))
        except CacheFullError as exc:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"prompt_logprobs: no room for the prompt for {wait_s:g} s ({exc}); try again later"
                ) from None
            time.sleep(_RETRY_S)


@torch.no_grad()
def prompt_logprobs(
    executor: Any, ids: list[int], k: int, tokenizer: Any, lora: Any = None
) -> list[PositionLogprobs | None]:
    # [P, V]: row i predicts token i + 1
    logits = executor.prompt_logits(ids, every_position=True, lora=lora)
    targets = torch.tensor(ids[1:], device=logits.device)
    chosen, ranks, top_ids, top_lps = [], [], [], []
    for start in range(0, len(ids) - 1, _CHUNK):
        lp = torch.log_softmax(logits[start : start + _CHUNK].float(), dim=-1)[: len(targets) - start]
        mine = lp.gather(1, targets[start : start + lp.shape[0], None])
        chosen.append(mine[:, 0])
        ranks.append((lp > mine).sum(dim=1) + 1)  # vLLM's rank: 1 + the tokens more likely
        if k:
            values, indices = lp.topk(k, dim=-1)
            top_ids.append(indices)
            top_lps.append(values)
    out: list[PositionLogprobs | None] = [None]
    if len(ids) == 1:
        return out
    chosen_host = torch.cat(chosen).tolist()
    ranks_host = torch.cat(ranks).tolist()
    tops = (torch.cat(top_ids).tolist(), torch.cat(top_lps).tolist()) if k else None
    text = token_text(tokenizer) if tokenizer is not None else (lambda t: None)
    for j, token in enumerate(ids[1:]):
        # The prompt's token first, then the top-k in rank order, as vLLM orders them.
        entry: PositionLogprobs = {token: Logprob(chosen_host[j], ranks_host[j], text(token))}
        if tops is not None:
            for rank, (t, lp) in enumerate(zip(tops[0][j], tops[1][j], strict=True), 1):
                entry[t] = Logprob(lp, rank, text(t))
        out.append(entry)
    return out
