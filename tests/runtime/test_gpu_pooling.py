"""The pooling API on CUDA: in float32, embed() is HF transformers' normalized last hidden state (the
fused kernels' rows of 1, 2-16 and more tokens included); in bf16 it is close to it; embedding beside
graph-replayed generation changes neither."""

import threading

import pytest
import torch
import torch.nn.functional as F
from test_pooling import PROMPTS, hf_hidden

from fastpath.runtime import LLM, SamplingParams

pytestmark = pytest.mark.gpu  # tests/conftest.py skips it where no CUDA device is visible

GPU = dict(device="cuda", max_seq_len=256, max_batch_size=4)


@pytest.mark.parametrize(("dtype", "atol"), [("float32", 1e-4), ("bfloat16", 3e-2)])
def test_cuda_embeddings_are_hfs_normalized_last_hidden_state(hf_checkpoints, dtype, atol):
    path = hf_checkpoints["llama"]
    with LLM(str(path), dtype=dtype, **GPU) as llm:
        outs = llm.embed(PROMPTS + PROMPTS[:1], use_tqdm=False)
    for prompt, out in zip(PROMPTS + PROMPTS[:1], outs, strict=True):
        want = F.normalize(hf_hidden(path, prompt)[-1], dim=-1)
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), want, atol=atol, rtol=0)


def test_cuda_embedding_beside_graphed_generation_changes_neither(hf_checkpoints):
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    with LLM(str(hf_checkpoints["llama"]), dtype="bfloat16", **GPU) as llm:
        assert llm.executor.runner.graphs is not None
        alone = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        vectors = [o.outputs.embedding for o in llm.embed(PROMPTS, use_tqdm=False)]
        result = {}
        worker = threading.Thread(
            target=lambda: result.update(out=llm.generate(PROMPTS, params, use_tqdm=False))
        )
        worker.start()
        during = [o.outputs.embedding for o in llm.embed(PROMPTS * 3, use_tqdm=False)]
        worker.join()
    assert [o.outputs[0].token_ids for o in result["out"]] == alone
    # One embedding a prompt whatever ran beside it: eager prefill rows, each its own sequence.
    torch.testing.assert_close(torch.tensor(during), torch.tensor(vectors * 3), atol=1e-2, rtol=0)


def test_cuda_embeddings_with_adapters_are_the_merged_models(hf_checkpoints, tmp_path):
    """float32 on CUDA: the prefill's deltas through the LoRA kernels, each prompt's adapter its own."""
    from lora_adapters import merged_model
    from lora_files import write_adapter

    from fastpath.runtime import LoRARequest

    base = hf_checkpoints["llama"]
    all_ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    a = LoRARequest("a", 1, write_adapter(base, tmp_path / "a", 1, 8, all_))
    b = LoRARequest("b", 2, write_adapter(base, tmp_path / "b", 2, 16, ["q_proj", "down_proj"]))
    loras = [a, None, b, a]
    with LLM(str(base), dtype="float32", enable_lora=True, max_loras=2, **GPU) as llm:
        outs = llm.embed(PROMPTS, lora_request=loras, use_tqdm=False)
    for prompt, r, out in zip(PROMPTS, loras, outs, strict=True):
        model = merged_model(base, r.lora_path if r else None)
        with torch.no_grad():
            hidden = model.model(torch.tensor([prompt])).last_hidden_state[0, -1]
        torch.testing.assert_close(
            torch.tensor(out.outputs.embedding), F.normalize(hidden, dim=-1), atol=1e-4, rtol=0
        )
