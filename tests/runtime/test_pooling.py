"""vLLM's pooling API (embed, encode) against HF transformers' base model: its last_hidden_state,
pooled as the pooler config says (last token, mean or first; normalized or not; a checkpoint's
sentence-transformers files), on one rank, two, and in the engine process."""

import functools
import json
import shutil
import threading

import pytest
import torch
import torch.nn.functional as F

from fastpath.runtime import LLM, LoRARequest, PoolingParams, SamplingParams

PROMPTS = [[1, 5, 9, 33, 7], list(range(3, 60)), [4], [7, 7, 8, 200, 13, 100, 2, 90, 44]]
CPU32 = dict(device="cpu", dtype="float32", max_seq_len=256, max_batch_size=4)


@torch.no_grad()
def hf_hidden(path, prompt: list[int]) -> torch.Tensor:
    return _base_model(str(path))(torch.tensor([prompt])).last_hidden_state[0].float()


@functools.cache
def _base_model(path: str):
    import transformers

    return transformers.AutoModel.from_pretrained(path, dtype=torch.float32).eval()


def pooled(hidden: torch.Tensor, kind: str) -> torch.Tensor:
    return {"LAST": hidden[-1], "MEAN": hidden.mean(0), "CLS": hidden[0]}[kind]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_embeddings_are_the_normalized_last_hidden_state(hf_checkpoints, arch):
    path = hf_checkpoints[arch]
    with LLM(str(path), **CPU32) as llm:
        outs = llm.embed(PROMPTS + PROMPTS, use_tqdm=False)  # more prompts than a batch
    assert [o.prompt_token_ids for o in outs] == PROMPTS + PROMPTS
    assert len({o.request_id for o in outs}) == 8 and all(o.finished for o in outs)
    for prompt, out in zip(PROMPTS + PROMPTS, outs, strict=True):
        want = F.normalize(hf_hidden(path, prompt)[-1], dim=-1)
        got = torch.tensor(out.outputs.embedding)
        assert out.outputs.hidden_size == want.shape[0]
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", ["MEAN", "CLS", "LAST"])
def test_the_pooler_config_and_pooling_params_choose_the_vector(hf_checkpoints, kind):
    path = hf_checkpoints["llama"]
    with LLM(str(path), pooler_config={"pooling_type": kind.lower(), "normalize": False}, **CPU32) as llm:
        raw = llm.encode(PROMPTS, use_tqdm=False)
        params = [
            PoolingParams(normalize=True),
            PoolingParams(dimensions=16),
            PoolingParams(),
            PoolingParams(),
        ]
        mixed = llm.embed(PROMPTS, params, use_tqdm=False)
        cut = llm.embed(PROMPTS[1], PoolingParams(truncate_prompt_tokens=9), use_tqdm=False)[0]
        tokens = llm.encode(PROMPTS[:2], pooling_task="token_embed", use_tqdm=False)
    for prompt, out in zip(PROMPTS, raw, strict=True):
        torch.testing.assert_close(
            out.outputs.data, pooled(hf_hidden(path, prompt), kind), atol=2e-6, rtol=1e-5
        )
    first = pooled(hf_hidden(path, PROMPTS[0]), kind)
    torch.testing.assert_close(
        torch.tensor(mixed[0].outputs.embedding), F.normalize(first, dim=-1), atol=2e-6, rtol=1e-5
    )
    second = pooled(hf_hidden(path, PROMPTS[1]), kind)[:16]  # Matryoshka: cut first, not normalized here
    torch.testing.assert_close(torch.tensor(mixed[1].outputs.embedding), second, atol=2e-6, rtol=1e-5)
    assert cut.prompt_token_ids == PROMPTS[1][-9:]
    torch.testing.assert_close(torch.tensor(cut.outputs.embedding), pooled(hf_hidden(path, PROMPTS[1][-9:]), kind),
                               atol=2e-6, rtol=1e-5)  # fmt: skip
    for prompt, out in zip(PROMPTS[:2], tokens, strict=True):
        torch.testing.assert_close(out.outputs.data, hf_hidden(path, prompt), atol=2e-6, rtol=1e-5)


def test_a_checkpoints_sentence_transformers_config_sets_the_pooling(hf_checkpoints, tmp_path):
    path = tmp_path / "st-llama"
    shutil.copytree(hf_checkpoints["llama"], path)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    with LLM(str(path), **CPU32) as llm:
        (out,) = llm.embed(PROMPTS[1], use_tqdm=False)
    want = F.normalize(hf_hidden(hf_checkpoints["llama"], PROMPTS[1]).mean(0), dim=-1)
    torch.testing.assert_close(torch.tensor(out.outputs.embedding), want, atol=2e-6, rtol=1e-5)
    # A config fastpath cannot run fails pooling, not the engine; a whole pooler_config overrides it.
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with LLM(str(path), **CPU32) as llm:
        with pytest.raises(
            ValueError, match="sentence-transformers pooling .* is not one of last, mean or cls"
        ):
            llm.embed(PROMPTS[1], use_tqdm=False)
        assert (
            llm.generate([PROMPTS[0]], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids
        )
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))
    (path / "modules.json").write_text(json.dumps([*modules[:2], {"idx": 2, "name": "2", "path": "2_Dense",
                                                   "type": "sentence_transformers.models.Dense"}]))  # fmt: skip
    with (
        LLM(str(path), **CPU32) as llm,
        pytest.raises(ValueError, match="modules include Dense, which fastpath"),
    ):
        llm.embed(PROMPTS[1], use_tqdm=False)
    with LLM(str(path), pooler_config={"pooling_type": "LAST", "normalize": False}, **CPU32) as llm:
        (out,) = llm.embed(PROMPTS[1], use_tqdm=False)
    last = hf_hidden(hf_checkpoints["llama"], PROMPTS[1])[-1]
    torch.testing.assert_close(torch.tensor(out.outputs.embedding), last, atol=2e-6, rtol=1e-5)


def test_embeddings_under_tensor_parallelism_and_in_the_engine_process(hf_checkpoints):
    path = str(hf_checkpoints["qwen2"])
    with LLM(path, **CPU32) as llm:
        want = [o.outputs.embedding for o in llm.embed(PROMPTS, use_tqdm=False)]
    for kw in (dict(tensor_parallel_size=2), dict(engine_process=True)):
        with LLM(path, **CPU32, **kw) as llm:
            got = [o.outputs.embedding for o in llm.embed(PROMPTS, use_tqdm=False)]
            text = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=1e-5)
        assert len(text[0].outputs[0].token_ids) == 4, "the engine generates after pooling"


def test_embedding_beside_generation_changes_neither(hf_checkpoints):
    """Pooling runs between the engine's steps, its blocks taken and given back: generation in
    another thread gives the tokens it gives alone."""
    path = str(hf_checkpoints["llama"])
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    with LLM(path, max_num_batched_tokens=64, **CPU32) as llm:
        alone = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        vectors = [o.outputs.embedding for o in llm.embed(PROMPTS * 3, use_tqdm=False)]
        result = {}
        worker = threading.Thread(
            target=lambda: result.update(out=llm.generate(PROMPTS, params, use_tqdm=False))
        )
        worker.start()
        during = [o.outputs.embedding for o in llm.embed(PROMPTS * 3, use_tqdm=False)]
        worker.join()
        free = llm.executor.allocator.num_free
        assert free == llm.executor.allocator.num_blocks - 1, "every block came back"
    assert [o.outputs[0].token_ids for o in result["out"]] == alone
    torch.testing.assert_close(torch.tensor(during), torch.tensor(vectors))


def test_pooling_waits_for_the_blocks_generation_holds(hf_checkpoints):
    """A prompt whose KV blocks running sequences hold waits for them, a step at a time, rather than
    failing; generation meanwhile gives its own tokens."""
    path = str(hf_checkpoints["llama"])
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    long = [(7 * i) % 300 + 3 for i in range(200)]
    with LLM(path, **dict(CPU32, kv_cache_blocks=24)) as llm:
        alone = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        want = llm.embed([long], use_tqdm=False)[0].outputs.embedding
        result = {}
        worker = threading.Thread(
            target=lambda: result.update(out=llm.generate(PROMPTS, params, use_tqdm=False))
        )
        worker.start()
        while llm.stats().running < 4 and worker.is_alive():
            pass
        got = llm.embed([long], use_tqdm=False)[0].outputs.embedding
        worker.join()
    assert [o.outputs[0].token_ids for o in result["out"]] == alone
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want))


def test_score_is_the_cosine_of_the_embeddings(hf_checkpoints):
    path = str(hf_checkpoints["llama"])
    with LLM(path, **CPU32) as llm:
        vectors = [torch.tensor(o.outputs.embedding) for o in llm.embed(PROMPTS, use_tqdm=False)]
        against_one = llm.score(PROMPTS[0], PROMPTS[1:], use_tqdm=False)
        pairwise = llm.score(PROMPTS[:2], PROMPTS[2:], use_tqdm=False)
        with pytest.raises(ValueError, match="score takes one data_1 or as many as data_2: got 2 and 3"):
            llm.score(PROMPTS[:2], PROMPTS[1:], use_tqdm=False)
    for out, other in zip(against_one, vectors[1:], strict=True):
        assert out.outputs.score == pytest.approx(
            float(F.cosine_similarity(vectors[0], other, dim=0)), abs=1e-6
        )
    assert pairwise[1].outputs.score == pytest.approx(float(vectors[1] @ vectors[3]), abs=1e-6)
    assert pairwise[1].prompt_token_ids == PROMPTS[1] + PROMPTS[3]


def test_bad_pooling_requests_are_refused_by_name(hf_checkpoints):
    path = str(hf_checkpoints["llama"])
    with pytest.raises(ValueError, match="pooler_config pooling_type must be one of LAST, MEAN, CLS"):
        LLM(path, pooler_config={"pooling_type": "max"}, **CPU32)
    with pytest.raises(ValueError, match="pooler_config takes pooling_type and normalize"):
        LLM(path, pooler_config={"pooling": "mean"}, **CPU32)
    with pytest.raises(ValueError, match=r"PoolingParams.dimensions must be None or an int >= 1"):
        PoolingParams(dimensions=0)
    with pytest.raises(ValueError, match="PoolingParams.normalize must be None, True or False"):
        PoolingParams(normalize="yes")
    with LLM(path, **CPU32) as llm:
        with pytest.raises(ValueError, match="dimensions 1000 is more than the model's 64"):
            llm.embed(PROMPTS[0], PoolingParams(dimensions=1000), use_tqdm=False)
        with pytest.raises(ValueError, match="embed prompt 1: .*out of range"):
            llm.embed([[1, 2], [10**7]], use_tqdm=False)
        with pytest.raises(
            ValueError, match=r"embed prompt 0: prompt of 300 tokens is longer than max_seq_len"
        ):
            llm.embed([[5] * 300], use_tqdm=False)
        assert llm.embed([[5] * 256], use_tqdm=False)[0].prompt_token_ids == [5] * 256, "a full context pools"
        with pytest.raises(ValueError, match="pooling_task 'classify' is not supported"):
            llm.encode(PROMPTS[0], pooling_task="classify", use_tqdm=False)
        with pytest.raises(ValueError, match="lora_request 'a': LoRA adapters are off"):
            llm.embed(PROMPTS[0], lora_request=LoRARequest("a", 1, "/nowhere"), use_tqdm=False)
        with pytest.raises(ValueError, match="score takes one lora_request"):
            llm.score(PROMPTS[0], PROMPTS[1], lora_request=[None, None], use_tqdm=False)
        for bad in (0, -5, True, 1.5):
            with pytest.raises(ValueError, match="truncate_prompt_tokens must be None or an int"):
                llm.embed(PROMPTS[1], truncate_prompt_tokens=bad, use_tqdm=False)
        with pytest.raises(ValueError, match="pooling_params has 2 entries for 1 prompts"):
            llm.embed(PROMPTS[0], [PoolingParams()] * 2, use_tqdm=False)
        assert len(llm.embed(PROMPTS[0], use_tqdm=False)[0].outputs.embedding) == 64, "the engine goes on"
