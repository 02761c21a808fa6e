"""Text in and out through the checkpoint's tokenizer; stream() yields what generate() returns."""

from fastpath.runtime import LLM, SamplingParams


def test_text_prompts_and_outputs(tiny_text_checkpoint):
    llm = LLM(str(tiny_text_checkpoint), device="cpu", max_seq_len=128)
    out = llm.generate(["The quick brown fox", [5, 6, 7]], SamplingParams(max_tokens=12, ignore_eos=True))
    assert out[0].prompt_token_ids == llm.tokenizer("The quick brown fox")["input_ids"]
    assert out[0].text == llm.tokenizer.decode(out[0].token_ids, skip_special_tokens=True)
    assert len(out[1].token_ids) == 12 and isinstance(out[1].text, str)
    assert llm.tokenizer.eos_token_id in llm.eos_ids


def test_stream_yields_the_generated_tokens_in_order():
    llm = LLM("random:tiny-qwen3", device="cpu", max_seq_len=96, max_batch_size=2)
    prompts = [[5, 6, 7], list(range(10, 40)), [9]]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (5, 9, 3)]
    expected = [o.token_ids for o in llm.generate(prompts, params)]
    got: list[list[int]] = [[], [], []]
    finished = {}
    for t in llm.stream(prompts, params):
        assert t.index not in finished, "no token after a request's last"
        got[t.index].append(t.token_id)
        if t.finish_reason:
            finished[t.index] = t.finish_reason
    assert got == expected and finished == {0: "length", 1: "length", 2: "length"}


def test_stopping_a_stream_early_leaves_the_engine_usable():
    llm = LLM("random:tiny-qwen3", device="cpu", max_seq_len=96)
    p = SamplingParams(max_tokens=8, ignore_eos=True)
    expected = llm.generate([[4, 5]], p)[0].token_ids
    stream = llm.stream([[7, 8, 9], [1, 2]], SamplingParams(max_tokens=30, ignore_eos=True))
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    assert not llm.executor.scheduler.has_work(), "the abandoned requests are aborted"
    assert llm.executor.allocator.num_free == llm.executor.allocator.num_blocks - 1
    assert llm.generate([[4, 5]], p)[0].token_ids == expected
