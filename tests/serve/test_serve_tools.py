"""Tool calls through the server, with the official openai client: a named tool and "required" held to
the tools' schemas by guided decoding (whole and streamed), "auto" read by the hermes, llama3_json and
pythonic parsers (the tiny model's text forced with vLLM's guided_regex, so the parse is what is tested), and an
earlier reply's calls reaching the chat template."""

import json

import jsonschema
import pytest
from serve_helpers import client, running

pytest.importorskip("xgrammar")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["c", "f"]}, "rain": {"type": "boolean"}},
            "required": ["unit", "rain"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "now"}}
SCHEMAS = {"get_weather": WEATHER["function"]["parameters"], "now": {"type": "object"}}
ASK = [{"role": "user", "content": "weather?"}]


@pytest.fixture(scope="module")
def url(llm):
    with running(llm) as url:
        yield url


def _named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def test_a_named_tool_gives_arguments_to_its_schema(url):
    r = client(url).chat.completions.create(
        model="tiny", messages=ASK, tools=[WEATHER, CLOCK], tool_choice=_named("get_weather"),
        max_tokens=60, temperature=1.0, seed=5, n=3,
    )  # fmt: skip
    finished = [c for c in r.choices if c.finish_reason == "stop"]
    assert len(finished) >= 2, [c.message for c in r.choices]
    for c in finished:
        (call,) = c.message.tool_calls
        assert c.message.content is None and call.type == "function" and call.id.startswith("call_")
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])
    assert len({c.message.tool_calls[0].id for c in finished}) == len(finished)


def test_a_named_tool_streams_its_arguments(url):
    chunks = list(
        client(url).chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=[WEATHER],
            tool_choice=_named("get_weather"),
            max_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 and d.id is None for d in deltas[1:])
    assert not any(ch.choices[0].delta.content for ch in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(
        json.loads("".join(d.function.arguments or "" for d in deltas)), SCHEMAS["get_weather"]
    )
    # the same call as the whole reply's
    whole = client(url).chat.completions.create(
        model="tiny", messages=ASK, tools=[WEATHER], tool_choice=_named("get_weather"), max_tokens=60,
        temperature=0,
    )  # fmt: skip
    assert whole.choices[0].message.tool_calls[0].function.arguments == "".join(
        d.function.arguments or "" for d in deltas
    )


def test_required_calls_one_or_more_of_the_tools(url):
    api = client(url)
    r = api.chat.completions.create(
        model="tiny", messages=ASK, tools=[WEATHER, CLOCK], tool_choice="required",
        max_tokens=120, temperature=1.0, seed=2, n=3,
    )  # fmt: skip
    finished = [c for c in r.choices if c.finish_reason == "tool_calls"]
    assert len(finished) >= 2, [(c.finish_reason, c.message) for c in r.choices]
    for c in finished:
        assert c.message.tool_calls and c.message.content is None
        for call in c.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    one = api.chat.completions.create(
        model="tiny", messages=ASK, tools=[WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=False,
        max_tokens=120, temperature=0,
    )  # fmt: skip
    assert one.choices[0].finish_reason == "tool_calls" and len(one.choices[0].message.tool_calls) == 1


def test_required_streams_each_call_whole(url):
    chunks = list(
        client(url).chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=[WEATHER, CLOCK],
            tool_choice="required",
            max_tokens=120,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    calls = [d for ch in chunks if ch.choices for d in (ch.choices[0].delta.tool_calls or [])]
    assert calls and [d.index for d in calls] == list(range(len(calls)))
    for d in calls:
        jsonschema.validate(json.loads(d.function.arguments), SCHEMAS[d.function.name])
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == ["tool_calls"] and chunks[-1].usage.completion_tokens > 0


def _read(r, chunks):
    """(content, tool calls, finish_reason) of a whole reply, or of its chunks when it streamed."""
    if chunks is not None:
        content = "".join(ch.choices[0].delta.content or "" for ch in chunks)
        calls = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
        return content, calls, chunks[-1].choices[0].finish_reason
    return r.choices[0].message.content, r.choices[0].message.tool_calls, r.choices[0].finish_reason


HERMES_REPLY = r'Sure\. <tool_call>\{"name": "get_weather", "arguments": \{"unit": "(c|f)", "rain": (true|false)\}\}</tool_call>'
LLAMA_REPLY = r'\{"name": "now", "parameters": \{\}\}; \{"name": "get_weather", "parameters": \{"unit": "c", "rain": true\}\}'


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_auto_reads_hermes_calls_out_of_the_text(llm, stream):
    with running(llm, enable_auto_tool_choice=True, tool_call_parser="hermes") as url:
        r = client(url).chat.completions.create(
            model="tiny", messages=ASK, tools=[WEATHER, CLOCK], max_tokens=200, temperature=0, stream=stream,
            extra_body={"guided_regex": HERMES_REPLY},
        )  # fmt: skip
        chunks = list(r) if stream else None
        plain = client(url).chat.completions.create(
            model="tiny", messages=ASK, tools=[WEATHER], max_tokens=8, temperature=0,
            extra_body={"guided_regex": "[a-z ]{4}"},
        )  # fmt: skip
    content, calls, finish = _read(r, chunks)
    assert content == "Sure. " and finish == "tool_calls"
    (call,) = calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])
    # a reply that calls nothing is content, finished as the engine finished it
    assert plain.choices[0].message.tool_calls is None and len(plain.choices[0].message.content) == 4
    assert plain.choices[0].finish_reason == "stop"


def test_auto_reads_llama3_json_calls(llm):
    with running(llm, enable_auto_tool_choice=True, tool_call_parser="llama3_json") as url:
        r = client(url).chat.completions.create(
            model="tiny", messages=ASK, tools=[WEATHER, CLOCK], tool_choice="auto", max_tokens=200,
            temperature=0, extra_body={"guided_regex": LLAMA_REPLY},
        )  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls] == [
        ("now", {}),
        ("get_weather", {"unit": "c", "rain": True}),
    ]


PYTHONIC_REPLY = r'\[now\(\), get_weather\(unit="c", rain=True\)\]'


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_auto_reads_pythonic_calls(llm, stream):
    with running(llm, enable_auto_tool_choice=True, tool_call_parser="pythonic") as url:
        r = client(url).chat.completions.create(
            model="tiny", messages=ASK, tools=[WEATHER, CLOCK], tool_choice="auto", max_tokens=200,
            temperature=0, stream=stream, extra_body={"guided_regex": PYTHONIC_REPLY},
        )  # fmt: skip
        chunks = list(r) if stream else None
    content, calls, finish = _read(r, chunks)
    assert not content and finish == "tool_calls"
    assert [(t.function.name, json.loads(t.function.arguments)) for t in calls] == [
        ("now", {}),
        ("get_weather", {"unit": "c", "rain": True}),
    ]


def test_an_earlier_call_and_its_result_reach_the_template(llm):
    template = (
        "{% for m in messages %}{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}"
        "({{ m.tool_calls[0].function.arguments.unit }}){% endif %}"
        "{% if m.role == 'tool' %}={{ m.content }}/{{ m.tool_call_id }}{% endif %}{% endfor %}"
    )
    call = {
        "id": "call_7",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"unit": "f"}'},
    }
    messages = [
        *ASK,
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_7", "content": "sunny"},
    ]
    with running(llm, trust_request_chat_template=True) as url:
        r = client(url).chat.completions.create(
            model="tiny", messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=2,
            extra_body={"chat_template": template, "return_token_ids": True},
        )  # fmt: skip
    want = llm.get_tokenizer()("get_weather(f)=sunny/call_7", add_special_tokens=False)["input_ids"]
    assert r.prompt_token_ids == want


def test_required_takes_tools_whose_parameters_refer_to_their_definitions(url):
    # as pydantic writes a nested model's schema (OpenAI's pydantic_function_tool, agent frameworks)
    place = {
        "type": "object",
        "properties": {"unit": {"enum": ["c", "f"]}},
        "required": ["unit"],
        "additionalProperties": False,
    }
    tool = {
        "type": "function",
        "function": {
            "name": "forecast",
            "parameters": {
                "type": "object",
                "properties": {"where": {"$ref": "#/$defs/Place"}},
                "required": ["where"],
                "additionalProperties": False,
                "$defs": {"Place": place},
            },
        },
    }
    r = client(url).chat.completions.create(
        model="tiny", messages=ASK, tools=[tool, CLOCK], tool_choice="required", max_tokens=120, temperature=0
    )
    c = r.choices[0]
    if c.finish_reason == "tool_calls":
        for call in c.message.tool_calls:
            args = json.loads(call.function.arguments)
            if call.function.name == "forecast":
                jsonschema.validate(args["where"], place)
    else:
        assert c.finish_reason == "length"


def test_an_earlier_call_nested_past_the_stack_is_no_500(url):
    call = {"id": "c", "type": "function", "function": {"name": "now", "arguments": "[" * 5000}}
    r = client(url).chat.completions.create(
        model="tiny", messages=[*ASK, {"role": "assistant", "tool_calls": [call]}], max_tokens=2
    )
    assert r.choices[0].finish_reason in ("stop", "length")
