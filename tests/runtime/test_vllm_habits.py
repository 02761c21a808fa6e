"""Code written for vLLM's offline API: its keywords, prompt dicts, logprob order and entry points."""

import pytest

from fastpath.runtime import LLM, LoRARequest, SamplingParams, TextPrompt, TokensPrompt
from fastpath.runtime.engine.options import parse_options
from fastpath.runtime.engine.outputs import RequestError

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_text_checkpoint):
    with LLM(
        str(tiny_text_checkpoint),
        device="cpu",
        max_model_len=256,
        max_num_seqs=4,
        trust_remote_code=True,  # in most vLLM snippets: accepted, nothing from the checkpoint runs
        enable_prefix_caching=False,
        disable_log_stats=True,
        swap_space=4,
    ) as engine:
        yield engine


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"quantization": "awq"}, "weights run unquantized"),
        ({"kv_cache_dtype": "fp8"}, "the KV cache holds the model's dtype"),
        ({"pipeline_parallel_size": 2}, "tensor parallelism only"),
        ({"trust_remote_code": "yes"}, "none from the checkpoint"),
        ({"max_logprobs": 50}, "at most 20 logprobs"),
        ({"task": "classify"}, "need heads fastpath does not have"),
        ({"download_dir": "/tmp/x"}, "nothing is downloaded"),
        ({"load_format": "dummy"}, "weights load from the checkpoint's safetensors"),
        ({"speculative_config": {"method": "ngram"}}, "no speculative decoding"),
        ({"logits_processors": ["my.Processor"]}, "no custom logits processors"),
        ({"block_size": 32}, "blocks hold 16 tokens"),
    ],
)
def test_vllm_keywords_asking_for_something_else_say_what_fastpath_does(kwargs, words):
    (key,) = kwargs
    with pytest.raises(ValueError, match=rf"^LLM\({key}=.* is not supported: .*{words}"):
        parse_options(kwargs)


def test_vllm_keywords_at_values_fastpath_honours_are_accepted_and_misspellings_still_caught():
    ok = {"trust_remote_code": False, "revision": None, "tokenizer_mode": "auto", "kv_cache_dtype": "auto",
          "quantization": None, "enable_chunked_prefill": True, "pipeline_parallel_size": 1, "max_logprobs": 20,
          "task": "generate", "compilation_config": None, "distributed_executor_backend": "mp",
          "load_format": "auto", "served_model_name": ["a", "b"], "enable_sleep_mode": False,
          "async_scheduling": True, "speculative_config": None, "model_impl": "auto", "logits_processors": None,
          "limit_mm_per_prompt": {}, "kv_cache_memory_bytes": None, "override_generation_config": None,
          "block_size": 16}  # fmt: skip
    assert parse_options({**ok, "max_model_len": 128}).max_seq_len == 128
    with pytest.raises(TypeError, match="'kv_cache_dtyp'; did you mean 'kv_cache_dtype'"):
        parse_options({"kv_cache_dtyp": "auto"})


def test_the_sampled_token_comes_first_in_each_logprobs_dict_then_the_top_k_by_rank(llm):
    params = SamplingParams(
        max_tokens=12, temperature=3.0, seed=7, logprobs=3, prompt_logprobs=2, ignore_eos=True
    )
    out = llm.generate([[5, 6, 7, 8, 9]], params, use_tqdm=False)[0]
    c = out.outputs[0]
    outside = 0
    for token, position in zip(c.token_ids, c.logprobs, strict=True):
        first, *rest = position.items()
        assert first[0] == token
        ranks = [e.rank for _, e in rest]
        assert ranks == sorted(ranks) and set(ranks) <= {1, 2, 3}
        outside += len(position) == 4
    assert outside  # sampled hot: some tokens fell outside the top 3, the case the order is about
    for token, position in zip([6, 7, 8, 9], out.prompt_logprobs[1:], strict=True):
        assert next(iter(position)) == token


def test_detokenize_false_spells_no_token_in_prompt_logprobs_either(llm):
    params = SamplingParams(max_tokens=2, logprobs=1, prompt_logprobs=1, detokenize=False)
    out = llm.generate(["hello there"], params, use_tqdm=False)[0]
    assert out.outputs[0].text == ""
    assert all(e.decoded_token is None for p in out.outputs[0].logprobs for e in p.values())
    assert all(e.decoded_token is None for p in out.prompt_logprobs[1:] for e in p.values())


def test_vllms_prompt_dicts_and_their_extra_keys(llm):
    ids = llm.get_tokenizer()("hello there")["input_ids"]
    want = llm.generate([ids], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    prompts = [TokensPrompt(prompt_token_ids=ids, cache_salt="tenant-a"), TextPrompt(prompt="hello there"),
               {"prompt": "hello there", "multi_modal_data": None, "mm_processor_kwargs": {}}]  # fmt: skip
    for out in llm.generate(prompts, GREEDY, use_tqdm=False):
        assert out.outputs[0].token_ids == want
    # An image is never dropped without a word: it fails its request, and the rest run.
    with pytest.raises(RequestError, match="multi_modal_data: this engine's models take text only"):
        llm.generate(
            [{"prompt": "hi", "multi_modal_data": {"image": object()}}, "hi"], GREEDY, use_tqdm=False
        )


def test_generate_and_chat_take_vllms_call_keywords_at_neutral_values(llm):
    assert llm.generate(["hi"], GREEDY, use_tqdm=False, lora_request=None, priority=[0])
    chat = [{"role": "user", "content": "hi"}]
    assert llm.chat(chat, GREEDY, use_tqdm=False, lora_request=None, chat_template_content_format="string")
    with pytest.raises(RequestError, match="lora_request must be a LoRARequest"):
        llm.generate(["hi"], GREEDY, use_tqdm=False, lora_request=object())
    with pytest.raises(RequestError, match=r"LoRA adapters are off; .*enable_lora=True"):
        llm.generate(["hi"], GREEDY, use_tqdm=False, lora_request=LoRARequest("a", 1, "/nowhere"))
    with pytest.raises(ValueError, match="priority is not supported"):
        llm.generate(["hi"], GREEDY, use_tqdm=False, priority=[1])
    with pytest.raises(ValueError, match="chat_template_content_format='openai' is not supported"):
        llm.chat(chat, GREEDY, use_tqdm=False, chat_template_content_format="openai")


@pytest.mark.parametrize("method", ["classify", "reward"])
def test_vllms_head_entry_points_say_they_are_not_here(llm, method):
    with pytest.raises(NotImplementedError, match=rf"LLM\.{method} needs a classification or reward head"):
        getattr(llm, method)(["hi"])


@pytest.mark.parametrize(("field", "value", "words"), [("logits_processors", [print], "no Python logits processors"),
                                                       ("extra_args", {"k": 1}, "no extension arguments"),
                                                       ("best_of", 4, "all returned"),
                                                       ("output_kind", 1, "stream\\(\\) and submit\\(\\) give deltas"),
                                                       ("flat_logprobs", True, "one a position")])  # fmt: skip
def test_vllms_sampling_fields_fastpath_lacks_say_so_instead_of_a_wrong_suggestion(field, value, words):
    with pytest.raises(
        TypeError, match=rf"SamplingParams\({field}=\.\.\.\) is vLLM's.*{words}.*takes {field}="
    ):
        SamplingParams(**{field: value})


def test_vllms_sampling_fields_at_the_values_vllm_code_passes_change_nothing():
    """Wrappers written for vLLM pass best_of=None, logits_processors=None and the like on every call."""
    import enum

    kind = enum.Enum("RequestOutputKind", "CUMULATIVE DELTA FINAL_ONLY")
    plain = SamplingParams(n=2, max_tokens=5, seed=3)
    for extra in ({"best_of": None}, {"best_of": 2}, {"logits_processors": None}, {"logits_processors": []},
                  {"extra_args": None}, {"extra_args": {}}, {"output_kind": None}, {"output_kind": 0},
                  {"output_kind": kind.FINAL_ONLY}, {"output_kind": kind.CUMULATIVE}, {"flat_logprobs": False}):  # fmt: skip
        got = SamplingParams(n=2, max_tokens=5, seed=3, **extra)
        assert (got.n, got.max_tokens, got.seed) == (plain.n, plain.max_tokens, plain.seed), extra
        assert got.best_of is None and got.logits_processors is None and got.output_kind is None
        assert got.extra_args is None and got.flat_logprobs is False
    with pytest.raises(TypeError, match="takes best_of=None or n only"):
        SamplingParams(n=2, best_of=3)
    np = pytest.importorskip("numpy")
    assert SamplingParams(n=np.int64(2), best_of=np.int64(2), output_kind=np.int8(2)).n == 2


def test_eos_and_stop_tokens_end_a_sequence_in_vllms_order():
    """The tokenizer's EOS first (no stop_reason), then stop_token_ids, then the model's other EOS ids,
    which vLLM makes stop tokens (their id as stop_reason)."""
    from fastpath.runtime.engine.sequence import Sequence

    def run(params, token, primary=2):
        seq = Sequence(0, [5, 6], params, 0, frozenset({2, 7}), 64, primary_eos=primary)
        seq.num_pending = 1
        seq.accept(token, -0.5)
        return seq.finish_reason, seq.stop_reason

    assert run(SamplingParams(stop_token_ids=[2, 9]), 2) == ("stop", None)  # the tokenizer's EOS first
    assert run(SamplingParams(stop_token_ids=[2, 9]), 9) == ("stop", 9)
    assert run(SamplingParams(stop_token_ids=[7]), 7) == ("stop", 7)
    assert run(SamplingParams(), 7) == ("stop", 7)  # generation_config's EOS: a stop token in vLLM
    assert run(SamplingParams(), 2) == ("stop", None)
    assert run(SamplingParams(stop_token_ids=[2, 9], ignore_eos=True), 2) == ("stop", 2)
    assert run(SamplingParams(ignore_eos=True), 7) == (None, None)
    assert run(SamplingParams(), 7, primary=None) == ("stop", None)  # no tokenizer: every EOS alike


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(llm):
    long = [5 + i % 200 for i in range(400)]  # past max_model_len (256)
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    with pytest.raises(RequestError, match="leaves no room to generate.*truncate_prompt_tokens"):
        llm.generate([long], greedy, use_tqdm=False)
    out = llm.generate([long], greedy.clone(truncate_prompt_tokens=10), use_tqdm=False)[0]
    assert out.prompt_token_ids == long[-10:]
    assert (
        out.outputs[0].token_ids == llm.generate([long[-10:]], greedy, use_tqdm=False)[0].outputs[0].token_ids
    )
    # -1: as much of the prompt as leaves room for one token.
    out = llm.generate([long], greedy.clone(truncate_prompt_tokens=-1), use_tqdm=False)[0]
    assert out.prompt_token_ids == long[-255:] and len(out.outputs[0].token_ids) == 1
    with pytest.raises(RequestError, match="truncate_prompt_tokens 300 leaves no room to generate"):
        llm.generate([long], greedy.clone(truncate_prompt_tokens=300), use_tqdm=False)
    short = llm.generate([[5, 6, 7]], greedy.clone(truncate_prompt_tokens=100), use_tqdm=False)[0]
    assert short.prompt_token_ids == [5, 6, 7]
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="truncate_prompt_tokens must be None, -1 or an int"):
            SamplingParams(truncate_prompt_tokens=bad)


def test_a_negative_seed_is_a_seed_as_in_vllm(llm):
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=-1, ignore_eos=True)
    a, b = (llm.generate(["hi"], params, use_tqdm=False)[0].outputs[0].token_ids for _ in range(2))
    assert a == b
    same = llm.generate(["hi"], params.clone(seed=(1 << 63) - 1), use_tqdm=False)[0].outputs[0].token_ids
    assert same == a  # taken mod 2**63


def test_what_ported_scripts_read_off_the_engine_and_its_outputs(llm):
    """llm.llm_engine's tokenizer and model config, and vLLM's output fields for what fastpath lacks."""
    engine = llm.llm_engine
    assert engine.get_tokenizer() is llm.get_tokenizer()
    assert engine.model_config.max_model_len == 256 == engine.get_model_config().max_model_len
    with pytest.raises(AttributeError, match="llm.llm_engine.add_request: fastpath has no vLLM LLMEngine"):
        engine.add_request  # noqa: B018
    out = llm.generate("Hello", GREEDY, use_tqdm=False)[0]
    assert (out.metrics, out.encoder_prompt, out.kv_transfer_params, out.multi_modal_placeholders) == (
        None, None, None, {})  # fmt: skip
    assert out.outputs[0].lora_request is None


def test_numpy_integers_are_taken_as_the_ints_they_are():
    np = pytest.importorskip("numpy")
    params = SamplingParams(max_tokens=np.int64(5), seed=np.int32(-3), top_k=np.int16(4), n=np.uint8(2))
    assert (params.max_tokens, params.seed, params.top_k, params.n) == (5, -3, 4, 2)
    assert all(type(v) is int for v in (params.max_tokens, params.seed, params.top_k, params.n))
    with pytest.raises(ValueError, match="max_tokens must be"):
        SamplingParams(max_tokens=np.int64(0))


def test_numpy_floats_and_token_ids_are_taken_as_pythons():
    """A sweep's np.float32 temperatures, and ids taken from an array, as vLLM takes them."""
    np = pytest.importorskip("numpy")
    params = SamplingParams(
        temperature=np.float32(0.5), top_p=np.float16(0.5), min_p=np.float64(0.25), repetition_penalty=np.float32(1.5),
        stop_token_ids=[np.int64(2)], allowed_token_ids=list(np.array([5, 6])), logit_bias={np.int64(5): np.float32(1.5)},
    )  # fmt: skip
    assert (params.temperature, params.top_p, params.min_p, params.repetition_penalty) == (
        0.5,
        0.5,
        0.25,
        1.5,
    )
    assert all(type(v) is float for v in (params.temperature, params.top_p, params.min_p))
    assert params.stop_token_ids == [2] and params.logit_bias == {5: 1.5}
    assert type(params.stop_token_ids[0]) is int and type(next(iter(params.logit_bias))) is int
    assert params == SamplingParams(temperature=0.5, top_p=0.5, min_p=0.25, repetition_penalty=1.5,
                                    stop_token_ids=[2], allowed_token_ids=[5, 6], logit_bias={5: 1.5})  # fmt: skip
    with pytest.raises(ValueError, match="temperature must be"):
        SamplingParams(temperature=np.float32("nan"))


def test_from_optional_gives_vllms_nones_their_defaults():
    """vLLM's: n, the penalties, temperature and top_p default when None; max_tokens None is "to the
    end of the context", as it is to SamplingParams."""
    params = SamplingParams.from_optional(
        n=None, temperature=None, presence_penalty=None, max_tokens=None, top_p=0.5
    )
    assert (params.n, params.temperature, params.presence_penalty, params.top_p) == (1, 1.0, 0.0, 0.5)
    assert params.max_tokens is None


def test_chat_template_kwargs_pass_documents_through_to_the_template(llm):
    template = "{% for d in documents %}[{{ d.text }}]{% endfor %}{{ messages[-1].content }}"
    prompt = llm.render_chat(  # the prompt chat() would run
        [{"role": "user", "content": "q"}], template, True, False, {"documents": [{"text": "A"}]}
    )
    assert prompt["prompt"] == "[A]q"
