"""Text in and out through the checkpoint's tokenizer; stream() yields what generate() returns."""

from fastpath.runtime import LLM, SamplingParams


def test_text_prompts_and_outputs(tiny_text_checkpoint):
    llm = LLM(str(tiny_text_checkpoint), device="cpu", max_seq_len=128)
    out = llm.generate(
        ["The quick brown fox", [5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    )
    assert out[0].prompt_token_ids == llm.tokenizer("The quick brown fox")["input_ids"]
    assert out[0].prompt == "The quick brown fox" and out[1].prompt is None
    first = out[0].outputs[0]
    context = llm.tokenizer.decode(out[0].prompt_token_ids[-6:], skip_special_tokens=True)
    whole = llm.tokenizer.decode(out[0].prompt_token_ids[-6:] + first.token_ids, skip_special_tokens=True)
    assert first.text == whole[len(context) :], "the text continues the prompt's, spacing included"
    assert len(out[1].outputs[0].token_ids) == 12 and isinstance(out[1].outputs[0].text, str)
    assert llm.tokenizer.eos_token_id in llm.eos_ids


def test_stream_yields_the_generated_tokens_and_text_in_order(tiny_text_checkpoint):
    llm = LLM(str(tiny_text_checkpoint), device="cpu", max_seq_len=96, max_batch_size=2)
    prompts = [[5, 6, 7], "The quick brown fox", [9]]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (5, 9, 3)]
    expected = {o.request_id: o.outputs[0] for o in llm.generate(prompts, params)}
    ids: dict[str, list[int]] = {}
    text: dict[str, str] = {}
    finished = {}
    order = {}
    for delta in llm.stream(prompts, params):
        rid, c = delta.request_id, delta.outputs[0]
        assert rid not in finished, "nothing after a request's last output"
        ids.setdefault(rid, []).extend(c.token_ids)
        text[rid] = text.get(rid, "") + c.text
        order.setdefault(rid, len(order))
        if delta.finished:
            finished[rid] = c.finish_reason
    assert list(finished.values()) == ["length"] * 3
    got = sorted(ids.values(), key=len)
    want = sorted((c.token_ids for c in expected.values()), key=len)
    assert got == want
    assert sorted(text.values()) == sorted(c.text for c in expected.values())


def test_stopping_a_stream_early_leaves_the_engine_usable():
    llm = LLM("random:tiny-qwen3", device="cpu", max_seq_len=96)
    p = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    expected = llm.generate([[4, 5]], p)[0].outputs[0].token_ids
    stream = llm.stream([[7, 8, 9], [1, 2]], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    stats = llm.stats()
    assert stats.running == stats.waiting == 0, "the abandoned requests are aborted when the stream closes"
    assert stats.kv_blocks_free == stats.kv_blocks_total
    assert llm.generate([[4, 5]], p)[0].outputs[0].token_ids == expected


def test_the_direct_decoder_equals_the_tokenizers_decode_and_clean_up_keeps_the_wrapper(tiny_text_checkpoint):
    import random

    from transformers import AutoTokenizer

    from fastpath.runtime.engine.detokenizer import text_decoder

    tok = AutoTokenizer.from_pretrained(str(tiny_text_checkpoint))
    tok.clean_up_tokenization_spaces = False
    decode = text_decoder(tok)
    assert decode.__name__ == "direct" and text_decoder(tok) is decode, "chosen once per tokenizer"
    rng = random.Random(0)
    specials = list(tok.all_special_ids)
    for _ in range(300):  # beyond the probe: any ids, special ones mixed in
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 12))] + rng.sample(specials, 1)
        rng.shuffle(ids)
        for skip in (True, False):
            assert decode(ids, skip) == tok.decode(ids, skip_special_tokens=skip)

    cleaning = AutoTokenizer.from_pretrained(str(tiny_text_checkpoint))
    cleaning.clean_up_tokenization_spaces = True  # transformers' own post-processing: keep its decode
    assert text_decoder(cleaning).__name__ == "wrapped"


def test_a_stream_carries_each_completions_finish_once():
    llm = LLM("random:tiny-qwen3", device="cpu", max_seq_len=96)
    # n=4 of different lengths: the early ones finish while the others still produce deltas.
    params = SamplingParams(
        n=4, temperature=1.0, seed=3, max_tokens=12, ignore_eos=True, stop_token_ids=list(range(0, 512, 9))
    )
    whole = llm.generate([[4, 5, 6]], params, use_tqdm=False)[0]
    finishes: dict[int, list[str]] = {}
    ids: dict[int, list[int]] = {}
    for delta in llm.stream([[4, 5, 6]], params):
        for c in delta.outputs:
            ids.setdefault(c.index, []).extend(c.token_ids)
            if c.finish_reason is not None:
                finishes.setdefault(c.index, []).append(c.finish_reason)
    assert finishes == {c.index: [c.finish_reason] for c in whole.outputs}
    assert ids == {c.index: c.token_ids for c in whole.outputs}
    assert len({len(c.token_ids) for c in whole.outputs}) > 1, "the completions end at different steps"
