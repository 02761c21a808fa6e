"""OpenAI's /v1/responses through the official client: the reply is the offline engine's chat reply
to the same messages (instructions as the system message), whole or as the typed stream events;
a reply cut by max_output_tokens is incomplete; what the server cannot do is a 400 naming the field."""

import json

import openai
import pytest
from serve_helpers import client, running

from fastpath.runtime import SamplingParams


@pytest.fixture(scope="module")
def url(llm):
    with running(llm) as url:
        yield url


def _offline(llm, messages, n):
    (out,) = llm.chat(messages, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
    return out


def test_a_response_is_the_chat_reply_to_the_same_messages(url, llm):
    r = client(url).responses.create(
        model="tiny", input="Say something.", instructions="Be brief.", max_output_tokens=8, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    want = _offline(
        llm, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}], 8
    )
    assert r.object == "response" and r.model == "tiny" and r.id.startswith("resp_")
    assert r.output_text == want.outputs[0].text
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert r.usage.input_tokens == len(want.prompt_token_ids) and r.usage.output_tokens == 8
    assert r.usage.total_tokens == r.usage.input_tokens + 8


def test_message_input_and_a_finished_reply(url, llm):
    messages = [
        {"role": "developer", "content": "Answer."},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "Hello "}, {"type": "input_text", "text": "there"}],
        },
    ]
    r = client(url).responses.create(model="tiny", input=messages, max_output_tokens=40, temperature=0)
    (want,) = llm.chat(  # a message's parts joined by newlines, as chat joins them
        [{"role": "system", "content": "Answer."}, {"role": "user", "content": "Hello \nthere"}],
        SamplingParams(temperature=0, max_tokens=40),
        use_tqdm=False,
    )
    assert r.output_text == want.outputs[0].text
    finished = want.outputs[0].finish_reason == "stop"
    assert r.status == ("completed" if finished else "incomplete")


def test_the_stream_is_the_responses_event_sequence(url, llm):
    stream = client(url).responses.create(
        model="tiny", input="Say something.", max_output_tokens=12, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"
    ]  # fmt: skip
    assert kinds[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    want = _offline(llm, [{"role": "user", "content": "Say something."}], 12).outputs[0].text
    assert deltas == want == events[-4].text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == 12


def test_json_schema_output_follows_the_schema(url):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    r = client(url).responses.create(
        model="tiny", input="Give me JSON.", max_output_tokens=40, temperature=0,
        text={"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}},
    )  # fmt: skip
    assert isinstance(json.loads(r.output_text)["a"], int)


@pytest.mark.parametrize(
    ("kwargs", "param", "words"),
    [
        (dict(input="hi", previous_response_id="resp_1"), "previous_response_id", "stores no responses"),
        (dict(input="hi", tools=[{"type": "web_search"}]), "tools.0.type", "'function'"),
        (
            dict(input="hi", tools=[{"type": "function", "name": "f"}]),
            "tool_choice",
            "--enable-auto-tool-choice",
        ),
        (
            dict(
                input="hi",
                tools=[{"type": "function", "name": "f"}],
                tool_choice={"type": "function", "name": "g"},
            ),
            "tool_choice",
            "'g', which is not one of the tools",
        ),
        (
            dict(
                input="hi",
                tools=[{"type": "function", "name": "f"}],
                tool_choice="required",
                text={"format": {"type": "json_object"}},
            ),
            "text.format",
            "already holds the output",
        ),
        (dict(input=[{"type": "function_call_output", "output": "x"}]), "input", ""),
        (dict(input=[]), "input", "at least one"),
        (dict(input="hi", max_output_tokens=0), "max_output_tokens", "greater than or equal to 1"),
        (dict(input="hi", text={"format": {"type": "xml"}}), "text", "text, json_object or json_schema"),
        (dict(input="hi", background=True), "background", "stores no responses"),
        (dict(input="hi", conversation="conv_1"), "conversation", "stores no conversations"),
        (dict(input="hi", prompt={"id": "pmpt_1"}), "prompt", "not supported"),
        (
            dict(input="hi", text={"format": {"type": "json_schema", "name": 5, "schema": {}}}),
            "text.format.name",
            "",
        ),
        (dict(input=[{"role": "user", "content": None}]), "input", ""),
        (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]), "input", ""),
    ],
)
def test_what_the_server_cannot_do_is_a_400_naming_the_field(url, kwargs, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        client(url).responses.create(model="tiny", **kwargs)
    assert caught.value.body["param"].startswith(param) and words in caught.value.body["message"], (
        caught.value.body
    )


def test_max_output_tokens_past_the_context_is_capped_as_vllm_caps_it(url, llm):
    r = client(url).responses.create(model="tiny", input="hi", max_output_tokens=10**6, temperature=0,
                                     extra_body={"ignore_eos": True})  # fmt: skip
    assert r.status == "incomplete" and r.usage.input_tokens + r.usage.output_tokens == llm.config.max_seq_len


def test_included_logprobs_are_the_chat_routes(url, llm):
    r = client(url).responses.create(
        model="tiny", input="Say something.", max_output_tokens=6, temperature=0, top_logprobs=2,
        include=["message.output_text.logprobs"], extra_body={"ignore_eos": True},
    )  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)
    (want,) = llm.chat([{"role": "user", "content": "Say something."}], params, use_tqdm=False)
    got = r.output[0].content[0].logprobs
    assert len(got) == 6 and all(len(t.top_logprobs) == 2 for t in got)
    for entry, token, position in zip(got, want.outputs[0].token_ids, want.outputs[0].logprobs, strict=True):
        assert entry.logprob == pytest.approx(position[token].logprob, abs=1e-5)
    plain = client(url).responses.create(
        model="tiny", input="Say something.", max_output_tokens=6, temperature=0
    )
    assert plain.output[0].content[0].logprobs == []


def test_no_response_is_stored_to_fetch(url):
    r = client(url).responses.create(model="tiny", input="hi", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError, match="stores no responses"):
        client(url).responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client(url).responses.cancel(r.id)


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"unit": {"enum": ["c", "f"]}},
        "required": ["unit"],
        "additionalProperties": False,
    },
}
CLOCK = {"type": "function", "name": "now"}


def test_a_named_function_tool_gives_a_function_call_item(url):
    r = client(url).responses.create(
        model="tiny", input="weather?", tools=[WEATHER, CLOCK], tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60, temperature=0,
    )  # fmt: skip
    (item,) = r.output
    assert item.type == "function_call" and item.name == "get_weather" and item.status == "completed"
    assert item.call_id.startswith("call_") and item.id.startswith("fc_")
    assert json.loads(item.arguments)["unit"] in ("c", "f")
    assert r.tool_choice.name == "get_weather" and [t.name for t in r.tools] == ["get_weather", "now"]


def test_required_streams_its_calls_as_items(url):
    with client(url).responses.stream(
        model="tiny", input="weather?", tools=[WEATHER, CLOCK], tool_choice="required", max_output_tokens=120,
        temperature=0,
    ) as stream:  # fmt: skip
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    calls = [i for i in final.output if i.type == "function_call"]
    assert calls and all(i.name in ("get_weather", "now") for i in calls)
    for i in calls:
        json.loads(i.arguments)
    added = [e.item.call_id for e in events if e.type == "response.output_item.added"]
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert added == [i.call_id for i in calls] and done == [i.arguments for i in calls]
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_named_call_streams_its_arguments_as_they_come(url):
    with client(url).responses.stream(
        model="tiny", input="weather?", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60, temperature=0,
    ) as stream:  # fmt: skip
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (item,) = final.output
    assert len(deltas) > 1 and "".join(deltas) == item.arguments


def test_earlier_calls_and_their_outputs_are_the_chats_tool_turns(url, llm):
    call = {"type": "function_call", "call_id": "call_1", "name": "now", "arguments": "{}"}
    result = {"type": "function_call_output", "call_id": "call_1", "output": "noon"}
    r = client(url).responses.create(
        model="tiny", input=[{"role": "user", "content": "time?"}, call, result], tools=[CLOCK], tool_choice="none",
        max_output_tokens=2, temperature=0,
    )  # fmt: skip
    messages = [
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "now", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "noon"},
    ]  # fmt: skip
    want = llm.render_chat(messages, tools=[{"type": "function", "function": {"name": "now"}}])
    assert r.usage.input_tokens == len(want["prompt_token_ids"])


def test_reasoning_is_an_item_of_its_own(llm):
    with running(llm, reasoning_parser="deepseek_r1") as url:
        whole = client(url).responses.create(model="tiny", input="think", max_output_tokens=6, temperature=0)
        with client(url).responses.stream(
            model="tiny", input="think", max_output_tokens=6, temperature=0
        ) as stream:
            events = list(stream)
    # the client's get_final_response wants response.completed; a reply cut short ends incomplete
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    (item,) = whole.output  # the tiny model never closes </think>: all reasoning, no message
    assert (
        item.type == "reasoning" and item.content[0].type == "reasoning_text" and item.status == "incomplete"
    )
    kinds = [e.type for e in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert events[3].part.type == "reasoning_text" and kinds[-3:-1] == [
        "response.content_part.done",
        "response.output_item.done",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == item.content[0].text == final.output[0].content[0].text
    assert final.status == whole.status == "incomplete"


def test_a_whole_reply_sent_back_with_its_reasoning_and_calls_is_the_next_turn(url, llm):
    said = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Let me look."}],
    }
    thought = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "hm"}],
    }
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "now",
        "arguments": "{}",
        "status": "completed",
    }
    result = {"type": "function_call_output", "call_id": "call_1", "output": "noon"}
    r = client(url).responses.create(
        model="tiny", input=[{"role": "user", "content": "time?"}, thought, said, call, result], tools=[CLOCK],
        tool_choice="none", max_output_tokens=2, temperature=0,
    )  # fmt: skip
    turns = [
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "now", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "noon"},
    ]  # fmt: skip
    want = llm.render_chat(turns, tools=[{"type": "function", "function": {"name": "now"}}])
    assert r.usage.input_tokens == len(want["prompt_token_ids"])


@pytest.mark.parametrize(
    ("item", "param", "words"),
    [
        ({"type": "item_reference", "id": "msg_1"}, "input.0", "items of this type are not taken"),
        (
            {"type": "reasoning", "summary": [], "encrypted_content": "x"},
            "input.0.encrypted_content",
            "encrypted",
        ),
    ],
)
def test_input_items_this_server_cannot_take_are_a_400(url, item, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        client(url).responses.create(model="tiny", input=[item])
    assert caught.value.body["param"] == param and words in caught.value.body["message"], caught.value.body


def test_a_call_cut_by_max_output_tokens_is_incomplete_whole_and_streamed(url):
    kw = dict(model="tiny", input="weather?", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
              max_output_tokens=3, temperature=0)  # fmt: skip
    whole = client(url).responses.create(**kw)
    with client(url).responses.stream(**kw) as stream:
        events = list(stream)
    streamed = events[-1].response
    for r in (whole, streamed):
        assert r.status == "incomplete" and [(i.type, i.status) for i in r.output] == [
            ("function_call", "incomplete")
        ]
