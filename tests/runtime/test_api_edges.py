"""Where vLLM users' habits meet the offline API's edges: interrupts, wrong argument types, tiny
temperatures, vLLM's dtype names, a context longer than the model's, and chat inputs."""

import signal

import pytest

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.engine.outputs import RequestError

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_text_checkpoint):
    with LLM(str(tiny_text_checkpoint), device="cpu", max_model_len=256, max_num_seqs=4) as engine:
        yield engine


def test_an_interrupted_generate_stops_its_requests(llm):
    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate([[5, 6, 7]] * 4, SamplingParams(max_tokens=250, ignore_eos=True), use_tqdm=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    stats = llm.stats()  # at once: the requests were still running when the interrupt came
    assert stats.running == stats.waiting == 0
    assert stats.kv_blocks_free == stats.kv_blocks_total
    assert llm.generate([5, 6], GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("prompts", "params", "message"),
    [
        (5, None, "prompts must be a prompt (a string, a list of token ids, or a dict"),
        (None, None, "got NoneType"),
        (b"hi", None, "got bytes"),
        ("hi", {"max_tokens": 3}, "sampling_params must be a SamplingParams or a list of them, got dict"),
    ],
)
def test_arguments_of_the_wrong_type_say_what_is_taken(llm, prompts, params, message):
    with pytest.raises(TypeError) as info:
        llm.generate(prompts, params, use_tqdm=False)
    assert message in str(info.value)


def test_errors_takes_raise_or_return(llm):
    with pytest.raises(ValueError, match="errors must be 'raise' or 'return', got 'ignore'"):
        llm.generate("hi", GREEDY, errors="ignore")


def test_a_tiny_positive_temperature_is_raised_to_vllms_floor_and_samples_real_tokens(llm):
    params = SamplingParams(temperature=1e-45, max_tokens=6, ignore_eos=True, seed=1)
    assert params.temperature == 0.01
    sampled = llm.generate([5, 6, 7], params, use_tqdm=False)[0].outputs[0].token_ids
    # At 0.01 the sample is the greedy token wherever the top logit leads by a margin; garbage is all 0.
    greedy = llm.generate([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    assert sampled == greedy[0].outputs[0].token_ids


def test_stop_strings_need_text():
    with pytest.raises(ValueError, match="stop strings are matched on text and need detokenize=True"):
        SamplingParams(stop=["."], detokenize=False)


@pytest.mark.parametrize(("name", "dtype"), [("auto", "float32"), ("float", "float32"), ("half", "float16")])
def test_vllms_dtype_names_are_taken(name, dtype):
    with LLM("random:tiny-qwen3", device="cpu", dtype=name, max_seq_len=64) as engine:
        assert str(engine.config.dtype) == f"torch.{dtype}"


def test_a_context_longer_than_the_model_was_trained_for_is_refused(monkeypatch):
    with pytest.raises(ValueError, match=r"max_seq_len \(max_model_len\) 4096 is longer than the model's"):
        LLM("random:tiny-qwen3", device="cpu", max_model_len=4096)
    monkeypatch.setenv("FASTPATH_ALLOW_LONG_MAX_MODEL_LEN", "1")
    with LLM("random:tiny-qwen3", device="cpu", max_model_len=4096, kv_cache_blocks=300) as engine:
        assert engine.config.max_seq_len == 4096


def test_chat_joins_text_parts_and_a_bad_conversation_fails_alone(llm):
    """Text parts are joined with a newline, as vLLM joins them, so the words stay apart."""
    plain = [{"role": "user", "content": "hello\nthere"}]
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]}
    ]
    expected = llm.chat(plain, GREEDY, use_tqdm=False)[0]
    assert llm.chat(parts, GREEDY, use_tqdm=False)[0].prompt_token_ids == expected.prompt_token_ids
    refused = [{"role": "assistant", "content": [{"type": "refusal", "refusal": "hello\nthere"}]}]
    as_text = [{"role": "assistant", "content": "hello\nthere"}]
    kw = {"use_tqdm": False, "add_generation_prompt": False, "continue_final_message": True}
    assert (
        llm.chat(refused, GREEDY, **kw)[0].prompt_token_ids
        == llm.chat(as_text, GREEDY, **kw)[0].prompt_token_ids
    )
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(RequestError) as info:
        llm.chat([plain, image], GREEDY, use_tqdm=False)
    assert "conversation 1: ValueError: only text content parts are supported" in str(info.value)
    good, bad = info.value.outputs
    assert good.outputs[0].token_ids == expected.outputs[0].token_ids
    assert bad.outputs[0].finish_reason == "error"


def test_chat_hands_tools_to_the_template(llm):
    tools = [{"type": "function", "function": {"name": "add"}}]
    template = "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}{{ messages[-1].content }}"
    out = llm.chat([{"role": "user", "content": "hi"}], GREEDY, chat_template=template, tools=tools)[0]
    assert out.prompt == "[add]hi"


def test_an_assistant_turn_without_content_renders_as_empty_text(llm):
    """An OpenAI tool-calling turn has content None (or none at all): vLLM renders it as empty text,
    and templates written for strings must not fail on it."""
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": []},
             {"role": "assistant"}, {"role": "user", "content": "again"}]  # fmt: skip
    out = llm.chat(turns, GREEDY, chat_template=template, use_tqdm=False)[0]
    assert out.prompt == "<user>hi<assistant><assistant><user>again"


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        ("hello", "got str: wrap a prompt as"),
        (5, "got int"),
        ({"role": "user", "content": "hi"}, "got dict"),
        (["hello"], r"messages\[0\] must be a message dict"),
        ([[{"role": "user", "content": "hi"}], "x"], r"messages\[1\] must be a message dict"),
    ],
)
def test_chat_given_something_other_than_conversations_is_one_type_error(llm, messages, words):
    with pytest.raises(TypeError, match=words):
        llm.chat(messages, GREEDY, use_tqdm=False)


def test_a_hole_in_a_list_of_sampling_params_is_a_type_error_not_the_defaults(llm):
    with pytest.raises(TypeError, match=r"sampling_params\[1\] must be a SamplingParams, got NoneType"):
        llm.generate(["a", "b"], [GREEDY, None], use_tqdm=False)


def test_assigning_to_sampling_params_says_to_clone(llm):
    """vLLM's examples assign to a SamplingParams; here they are immutable, and the error says how."""
    params = llm.get_default_sampling_params()
    with pytest.raises(AttributeError, match=r"use params.clone\(max_tokens=...\)"):
        params.max_tokens = 8
    assert params.clone(max_tokens=8).max_tokens == 8
    with pytest.raises(AttributeError) as info:
        params.max_token = 8  # not a field: clone would refuse it too, so it is not suggested
    assert "clone" not in str(info.value)


def test_clone_copies_with_changes_checked_and_the_constraint_kept():
    p = SamplingParams(temperature=0.5, structured_outputs={"regex": "[0-9]+"}, max_tokens=5)
    q = p.clone(max_tokens=10)
    assert (q.max_tokens, q.temperature, q.guided) == (10, 0.5, {"regex": "[0-9]+"})
    assert p.clone().guided == p.guided and p.max_tokens == 5
    assert p.clone(guided_decoding={"choice": ["a"]}).guided == {"choice": ["a"]}
    with pytest.raises(ValueError, match="temperature"):
        p.clone(temperature=-1)


def test_an_unseeded_request_does_not_sample_what_a_small_explicit_seed_does():
    from fastpath.runtime.engine.llm import LINK_SHIFT, _derived_seed

    seeds = {_derived_seed(0, i) for i in range(1000)}
    assert len(seeds) == 1000 and not seeds & set(range(1000))
    assert _derived_seed(0, 5) != _derived_seed(0, (1 << LINK_SHIFT) + 5) != _derived_seed(1, 5)


def test_chat_template_kwargs_carry_template_variables_only(llm):
    with pytest.raises(ValueError, match="'return_tensors' is an argument of the tokenizer's chat call"):
        llm.chat([{"role": "user", "content": "hi"}], GREEDY, chat_template_kwargs={"return_tensors": "np"})
