"""Reasoning apart from the answer, without a server: each parser on whole replies, and a stream cut
anywhere sending what the whole reply gives, with tool calls read from the answer only."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serve_helpers import cut_anywhere

from fastpath.runtime.serve.chat_reply import ReplyShape
from fastpath.runtime.serve.reasoning import ReasoningStream, split
from fastpath.runtime.serve.tool_calls import ToolPlan


@pytest.mark.parametrize(
    ("parser", "text", "want"),
    [
        ("deepseek_r1", "<think>\nhmm</think>\n\nIt is 4.", ("\nhmm", "\n\nIt is 4.")),
        ("deepseek_r1", "hmm, 2 + 2</think>4", ("hmm, 2 + 2", "4")),  # the template opened <think>
        ("deepseek_r1", "still thinking when max_tokens came", ("still thinking when max_tokens came", "")),
        ("qwen3", "<think>\nhmm\n</think>\n\n4", ("\nhmm\n", "\n\n4")),
        ("qwen3", "  <think></think>4", ("", "4")),
        (
            "qwen3",
            "4, without thinking (enable_thinking false)",
            (None, "4, without thinking (enable_thinking false)"),
        ),
        ("qwen3", "<think>cut off", ("cut off", "")),
    ],
)
def test_whole_replies(parser, text, want):
    assert split(parser, text) == want


def test_an_unknown_parser_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown reasoning parser 'r2'"):
        split("r2", "x")


WORDS = st.sampled_from(["<think>", "</think>", "<", "</", "think", ">", "a", " ", "\n", "4", "<th", "k>"])


@settings(max_examples=300, deadline=None)
@given(parser=st.sampled_from(["deepseek_r1", "qwen3"]), words=st.lists(WORDS, max_size=12), data=st.data())
def test_a_stream_cut_anywhere_sends_what_the_whole_reply_gives(parser, words, data):
    text = "".join(words)
    pieces = cut_anywhere(data, text)
    stream, reasoning, answer = ReasoningStream(parser), "", ""
    for i, piece in enumerate(pieces):
        r, a = stream.feed(piece, i == len(pieces) - 1)
        reasoning += r
        answer += a
    want_reasoning, want_answer = split(parser, text)
    assert (reasoning, answer) == (want_reasoning or "", want_answer)
    assert stream.reasoned == (want_reasoning is not None)


def test_a_reply_reads_its_reasoning_then_its_tool_calls():
    shape = ReplyShape(ToolPlan("auto", parser="hermes"), "deepseek_r1")
    text = 'I should call it.</think>On it. <tool_call>{"name": "now", "arguments": {}}</tool_call>'
    message, finish = shape.message(text, "stop")
    assert message["reasoning"] == message["reasoning_content"] == "I should call it."
    assert message["content"] == "On it. " and message["tool_calls"][0]["function"]["name"] == "now"
    assert finish == "tool_calls"
    # a call written inside the thinking is no call
    thought = 'maybe <tool_call>{"name": "now", "arguments": {}}</tool_call>?</think>No need.'
    message, finish = shape.message(thought, "stop")
    assert "tool_calls" not in message and message["content"] == "No need." and finish == "stop"
    # streamed, piece by piece, the same reply
    stream, got = shape.stream(), {"reasoning": "", "content": "", "tool_calls": []}
    for i, ch in enumerate(text):
        delta = stream.feed(ch, i == len(text) - 1)
        got["reasoning"] += delta.get("reasoning", "")
        got["content"] += delta.get("content", "")
        got["tool_calls"] += delta.get("tool_calls", [])
    assert got["reasoning"] == "I should call it." and got["content"] == "On it. "
    assert [json.loads(c["function"]["arguments"]) for c in got["tool_calls"]] == [{}]
    assert stream.finish_reason("stop") == "tool_calls"


def test_include_reasoning_false_drops_it_and_an_answerless_reply_has_null_content():
    shape = ReplyShape(ToolPlan(), "deepseek_r1", include_reasoning=False)
    message, _ = shape.message("thinking</think>done", "stop")
    assert message == {"role": "assistant", "content": "done"}
    message, finish = ReplyShape(ToolPlan(), "qwen3").message("<think>long thought", "length")
    assert message["content"] is None and message["reasoning"] == "long thought" and finish == "length"
    stream = ReplyShape(ToolPlan(), "deepseek_r1", include_reasoning=False).stream()
    assert stream.feed("thinking</think>", False) == {} and stream.feed("done", True) == {"content": "done"}


def test_whitespace_between_the_thinking_and_a_call_is_no_content_whole_or_streamed():
    shape = ReplyShape(ToolPlan("auto", parser="hermes"), "qwen3")
    text = '<think>call it</think>\n\n<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    message, _ = shape.message(text, "stop")
    assert message["content"] is None and message["reasoning"] == "call it"
    stream = shape.stream()
    deltas = [stream.feed(ch, i == len(text) - 1) for i, ch in enumerate(text)]
    assert not any("content" in d for d in deltas)
    assert "".join(d.get("reasoning", "") for d in deltas) == "call it"
    # whitespace that no call follows is content after all
    stream = ReplyShape(ToolPlan("auto", parser="hermes")).stream()
    assert stream.feed("\n", False) == {} and stream.feed(" ", True) == {"content": "\n "}


REPLY_WORDS = st.sampled_from(
    ["<think>", "</think>", "<tool_call>", "</tool_call>", '{"name": "now", "arguments": {}}', "<tool", "_call>",
     "</", "think>", "{", "}", ";", " ", "\n", "hi", "<|python_tag|>"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    thinking=st.sampled_from(["deepseek_r1", "qwen3"]),
    tools=st.sampled_from(["hermes", "llama3_json", None]),
    words=st.lists(REPLY_WORDS, max_size=12),
    data=st.data(),
)
def test_a_streamed_reply_reads_as_the_whole_one(thinking, tools, words, data):
    text = "".join(words)
    pieces = cut_anywhere(data, text) or [""]
    shape = ReplyShape(ToolPlan("auto", parser=tools) if tools else ToolPlan(), thinking)
    message, finish = shape.message(text, "stop")
    stream, got = shape.stream(), {"reasoning": "", "content": "", "calls": []}
    for i, piece in enumerate(pieces):
        delta = stream.feed(piece, i == len(pieces) - 1)
        got["reasoning"] += delta.get("reasoning", "")
        got["content"] += delta.get("content", "")
        got["calls"] += [
            (c["function"]["name"], c["function"]["arguments"]) for c in delta.get("tool_calls", ())
        ]
    assert got["reasoning"] == (message.get("reasoning") or "")
    assert got["content"] == (message["content"] or "")
    assert got["calls"] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", ())
    ]
    assert stream.finish_reason("stop") == finish


class _Tokens:
    """A tokenizer whose markers are one token each (ids 1 and 2) and every other character one token."""

    def __init__(self, markers: bool = True) -> None:
        self.markers = markers

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, at = [], 0
        while at < len(text):
            for marker, i in (("<think>", 1), ("</think>", 2)):
                if self.markers and text.startswith(marker, at):
                    ids.append(i)
                    at += len(marker)
                    break
            else:
                ids.append(100 + ord(text[at]))
                at += 1
        return ids


@pytest.mark.parametrize("markers", [True, False], ids=["marker tokens", "markers spelled out"])
def test_reasoning_tokens_are_those_inside_the_think_block(markers):
    from fastpath.runtime.serve.reasoning import reasoning_tokens

    tok = _Tokens(markers)
    for parser, text, want in (
        ("deepseek_r1", "<think>hmm</think>4", 3),
        ("deepseek_r1", "hm</think>4", 2),  # the template opened the block
        ("deepseek_r1", "<think>cut off", 7),  # max_tokens came first: all thinking
        ("deepseek_r1", "no markers", 10),
        ("qwen3", "<think>ab</think>cd", 2),
        ("qwen3", "no think", 0),
        ("deepseek_r1", "<think></think>4", 0),
        ("qwen3", "  <think>ab</think>c", 2),  # whitespace before <think> is not thinking
    ):
        assert reasoning_tokens(parser, tok, tok.encode(text), text) == want, (parser, text)
    assert reasoning_tokens("deepseek_r1", None, [5, 6], "ab") == 0


def test_under_a_reasoning_parser_a_grammar_waits_for_the_close_marker():
    """chat_run's choice: with </think> one token, the grammar holds the reply after it and the reply is
    split; without, the grammar holds it from the first token and it is all answer (no split)."""
    from types import SimpleNamespace

    from fastpath.runtime import SamplingParams
    from fastpath.runtime.engine.sampling_params import GuidedDecodingParams
    from fastpath.runtime.serve.chat import _after_reasoning

    class Tokens:
        def __init__(self, one: bool) -> None:
            self.one = one

        def encode(self, text, add_special_tokens=False):
            return [7] if self.one else [7, 8, 9]

    def state(parser, one=True):
        llm = SimpleNamespace(get_tokenizer=lambda: Tokens(one))
        return SimpleNamespace(config=SimpleNamespace(reasoning_parser=parser), llm=llm)

    guided = SamplingParams(guided_decoding=GuidedDecodingParams(json={"type": "object"}))
    params, thinking = _after_reasoning(state("qwen3"), guided)
    assert thinking == "qwen3" and params.guided["after_reasoning"] == ["<think>", "</think>"]
    assert params.guided["json_schema"] == {"type": "object"}
    params, thinking = _after_reasoning(state("deepseek_r1", one=False), guided)
    assert thinking is None and "after_reasoning" not in params.guided
    plain = SamplingParams()
    assert _after_reasoning(state("qwen3"), plain) == (plain, "qwen3")  # no grammar: split as before
    assert _after_reasoning(state(None), guided) == (guided, None)


def test_a_named_tool_opens_its_call_only_when_the_answer_begins():
    """Streamed as the whole reply reads: the reasoning first, then one call, its arguments whole."""
    shape = ReplyShape(ToolPlan("named", name="now", schema={}), "deepseek_r1")
    stream = shape.stream()
    deltas = [
        stream.feed(piece, i == 3)
        for i, piece in enumerate(["hm, ", "the time", "</think>", '{"tz": "UTC"}'])
    ]
    assert [set(d) for d in deltas[:3]] == [{"reasoning", "reasoning_content"}] * 2 + [set()]
    (call,) = deltas[3]["tool_calls"]
    assert call["function"] == {"name": "now", "arguments": '{"tz": "UTC"}'}
    whole, _ = shape.message('hm, the time</think>{"tz": "UTC"}', "stop")
    assert (
        whole["reasoning"] == "hm, the time"
        and whole["tool_calls"][0]["function"]["arguments"] == '{"tz": "UTC"}'
    )


def test_a_prompt_that_closed_the_thinking_is_read_unsplit():
    """ChatRun.judging: where the rendered prompt already closed the thinking, the grammar holds the reply
    from its first token (the engine's rule), so a deepseek_r1 reply without </think> is answer."""
    from types import SimpleNamespace

    from fastpath.runtime import SamplingParams
    from fastpath.runtime.engine.sampling_params import GuidedDecodingParams
    from fastpath.runtime.serve.chat import ChatRun

    class Tokens:
        def encode(self, text, add_special_tokens=False):
            return {"<think>": [1], "</think>": [2]}[text]

    state = SimpleNamespace(llm=SimpleNamespace(get_tokenizer=Tokens))
    guided = GuidedDecodingParams(json={"type": "object"}, after_reasoning=("<think>", "</think>"))
    for prompt_ids, splits in (([5, 1, 6, 2, 7], False), ([5, 1, 6], True), ([5, 6], True)):
        run = ChatRun(SamplingParams(guided_decoding=guided), None, ReplyShape(ToolPlan(), "deepseek_r1"))
        assert run.judging(state, lambda ids=prompt_ids: [{"prompt_token_ids": ids}])() == [
            {"prompt_token_ids": prompt_ids}
        ]
        assert (run.reply_shape().reasoning == "deepseek_r1") is splits, prompt_ids
    plain = ChatRun(SamplingParams(), None, ReplyShape(ToolPlan(), "deepseek_r1"))
    prompts = lambda: [{"prompt_token_ids": [2]}]  # noqa: E731
    assert plain.judging(state, prompts) is prompts and plain.reply_shape().reasoning == "deepseek_r1"
