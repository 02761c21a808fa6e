"""Prefix caching on CUDA: graphs, the paged prefill kernel and mixed batches read the shared blocks
as their own, so the tokens equal the uncached engine's."""

import pytest
from test_sampling_controls import token_ids

from fastpath.runtime import LLM, SamplingParams

pytestmark = pytest.mark.gpu  # tests/conftest.py skips it where no CUDA device is visible


def test_cached_prefixes_give_the_uncached_tokens_on_cuda():
    system = [(j * 13 + 5) % 500 + 3 for j in range(300)]
    prompts = [system + [(i * 7 + j) % 500 + 3 for j in range(5 + 9 * i)] for i in range(12)]
    params = [
        SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8 * (i % 2), seed=i) for i in range(12)
    ]
    kw = dict(device="cuda", dtype="float32", max_seq_len=512, max_batch_size=8)
    want = [token_ids(o) for o in LLM("random:tiny-llama", **kw).generate(prompts, params)]
    llm = LLM("random:tiny-llama", enable_prefix_caching=True, **kw)
    try:
        llm.generate(prompts[:1], params[0])
        assert [token_ids(o) for o in llm.generate(prompts, params)] == want
        assert llm.stats().prefix_cache_hits >= 12 * 288
    finally:
        llm.close()
