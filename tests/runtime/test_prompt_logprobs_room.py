"""prompt_logprobs takes an extra prefill outside the scheduler: with the KV cache full it waits for
room (bounded), instead of failing a valid request."""

import time

import pytest

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.engine.prompt_logprobs import prompt_logprobs_when_room
from fastpath.runtime.runner.kv_cache import CacheFullError


class FullFor:
    """A core whose cache is full for its first `n` calls."""

    def __init__(self, n: int):
        self.n, self.calls = n, 0

    def call(self, fn):
        self.calls += 1
        if self.calls <= self.n:
            raise CacheFullError("need 4 KV blocks, 1 free")
        return ["positions"]


def test_it_retries_until_the_cache_has_room():
    core = FullFor(3)
    assert prompt_logprobs_when_room(core, None, [1, 2], 1, None, wait_s=5) == ["positions"]
    assert core.calls == 4


def test_a_cache_that_stays_full_is_a_timeout_naming_the_wait():
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"prompt_logprobs: no room for the prompt for 0.2 s \(need 4"):
        prompt_logprobs_when_room(FullFor(10**9), None, [1, 2], 1, None, wait_s=0.2)
    assert time.monotonic() - started < 5


def test_a_request_arriving_at_a_full_cache_gets_its_prompt_logprobs():
    with LLM("random:tiny-llama", device="cpu", dtype="float32", max_seq_len=128, kv_cache_blocks=9) as llm:
        long = llm.submit(list(range(5, 69)), SamplingParams(max_tokens=64, ignore_eos=True))
        for _ in range(2000):  # until the long request holds more than the 4 blocks the next one needs
            if llm.stats().kv_blocks_free < 4 or long.finished:
                break
            time.sleep(0.005)
        prompt = list(range(7, 71))
        (out,) = llm.generate([prompt], SamplingParams(max_tokens=2, prompt_logprobs=1), use_tqdm=False)
        assert long.result().outputs[0].finish_reason == "length"
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        assert all(prompt[j] in out.prompt_logprobs[j] for j in range(1, len(prompt)))
