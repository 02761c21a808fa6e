"""--reasoning-parser through the server with the openai client. The tiny model writes no `</think>`, so
under deepseek_r1 its whole reply is reasoning (as an R1 reply cut by max_tokens), and under qwen3,
which needs a leading `<think>`, all of it is content: both checked against the same request on a
server without a parser, whole and streamed."""

import json

import pytest
from serve_helpers import client, running

ASK = dict(model="tiny", messages=[{"role": "user", "content": "think"}], max_tokens=8, temperature=0)


@pytest.fixture(scope="module")
def plain_text(llm):
    with running(llm) as url:
        text = client(url).chat.completions.create(**ASK).choices[0].message.content
    assert text and "</think>" not in text and not text.lstrip().startswith("<think>")
    return text


def _streamed(url, **kw) -> tuple[str, str, list]:
    chunks = list(client(url).chat.completions.create(**{**ASK, **kw}, stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    return reasoning, content, chunks


def test_deepseek_r1_sends_an_unclosed_reply_as_reasoning(llm, plain_text):
    with running(llm, reasoning_parser="deepseek_r1") as url:
        message = client(url).chat.completions.create(**ASK).choices[0].message
        reasoning, content, chunks = _streamed(url)
        hidden = client(url).chat.completions.create(**ASK, extra_body={"include_reasoning": False})
        guided = client(url).chat.completions.create(
            **{**ASK, "max_tokens": 60}, response_format={"type": "json_object"}
        )
    assert message.content is None
    assert message.model_extra["reasoning"] == message.model_extra["reasoning_content"] == plain_text
    assert (reasoning, content) == (plain_text, "")
    assert chunks[-1].choices[0].finish_reason == "length"
    assert hidden.choices[0].message.content is None and "reasoning" not in (
        hidden.choices[0].message.model_extra or {}
    )
    # a reply held to a grammar is all answer
    if guided.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(guided.choices[0].message.content), dict)
    assert "reasoning" not in (guided.choices[0].message.model_extra or {})


def test_qwen3_sends_a_reply_without_think_as_content(llm, plain_text):
    with running(llm, reasoning_parser="qwen3") as url:
        message = client(url).chat.completions.create(**ASK).choices[0].message
        reasoning, content, _ = _streamed(url)
    assert message.content == plain_text and "reasoning" not in (message.model_extra or {})
    assert (reasoning, content) == ("", plain_text)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_responses_count_the_reasoning_tokens(llm, stream):
    """The tiny model's reply is all reasoning under deepseek_r1 (no </think>), none under qwen3."""
    ask = dict(model="tiny", input="think", max_output_tokens=8, temperature=0)
    for parser, all_of_it in (("deepseek_r1", True), ("qwen3", False), (None, False)):
        with running(llm, reasoning_parser=parser) as url:
            if stream:
                with client(url).responses.stream(**ask) as events:
                    usage = list(events)[-1].response.usage  # response.incomplete: cut at 8 tokens
            else:
                usage = client(url).responses.create(**ask).usage
        assert usage.output_tokens == 8
        assert usage.output_tokens_details.reasoning_tokens == (8 if all_of_it else 0), parser


def test_an_unknown_parser_is_refused_when_the_server_is_configured():
    from fastpath.runtime.serve.config import ServeConfig

    with pytest.raises(ValueError, match="reasoning_parser must be None or one of deepseek_r1, qwen3"):
        ServeConfig(reasoning_parser="r2")
