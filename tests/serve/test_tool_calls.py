"""Tool calls without a server: which plan a request's tools make, the schemas named and required calls
are held to, the hermes, llama3_json and pythonic parsers, and a stream read piece by piece."""

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serve_helpers import cut_anywhere

from fastpath.runtime.serve.errors import RequestInvalid
from fastpath.runtime.serve.protocol import ChatRequest
from fastpath.runtime.serve.tool_calls import ToolPlan, ToolStream, parse, plan

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "now"}}  # no parameters


def _body(**kw) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER, CLOCK], **kw)


def test_no_tools_or_none_plans_nothing():
    assert plan(ChatRequest(messages=[{"role": "user", "content": "hi"}]), None).mode == "none"
    assert plan(_body(tool_choice="none"), None) == ToolPlan()


def test_a_named_tool_is_held_to_its_parameters():
    p = plan(_body(tool_choice={"type": "function", "function": {"name": "get_weather"}}), None)
    assert (p.mode, p.name, p.schema) == ("named", "get_weather", WEATHER["function"]["parameters"])
    content, calls = p.extract('{"city": "Oslo"}')
    assert content is None and [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Oslo"}')]
    assert calls[0].id.startswith("call_") and p.finish_reason("stop", calls) == "stop"
    clock = plan(_body(tool_choice={"type": "function", "function": {"name": "now"}}), None)
    assert clock.schema == {"type": "object", "properties": {}}


def test_required_is_a_list_of_calls_to_the_given_tools():
    p = plan(_body(tool_choice="required"), None)
    good = [
        {"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}},
        {"name": "now", "parameters": {}},
    ]
    jsonschema.validate(good, p.schema)
    for bad in (
        [],
        [{"name": "launch", "parameters": {}}],
        [{"name": "get_weather", "parameters": {"unit": "c"}}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, p.schema)
    content, calls = p.extract(json.dumps(good))
    assert content is None and [c.name for c in calls] == ["get_weather", "now"]
    assert json.loads(calls[0].arguments) == {"city": "Oslo", "unit": "c"}
    assert p.finish_reason("stop", calls) == "tool_calls" and p.finish_reason("length", calls) == "length"
    # cut at max_tokens: no call, the text is the content
    assert p.extract('[{"name": "now", "param') == ('[{"name": "now", "param', [])
    single = plan(_body(tool_choice="required", parallel_tool_calls=False), None)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, single.schema)


def test_auto_needs_the_servers_parser():
    for body in (_body(tool_choice="auto"), _body()):
        with pytest.raises(RequestInvalid, match="--enable-auto-tool-choice") as info:
            plan(body, None)
        assert info.value.param == "tool_choice"
    assert plan(_body(), "hermes") == ToolPlan("auto", parser="hermes")


def test_a_tool_choice_is_checked_against_the_tools():
    with pytest.raises(ValueError, match="tool_choice: names 'launch', which is not one of the tools"):
        _body(tool_choice={"type": "function", "function": {"name": "launch"}})
    with pytest.raises(ValueError, match="tool_choice: 'required' needs tools"):
        ChatRequest(messages=[{"role": "user", "content": "hi"}], tool_choice="required")
    with pytest.raises(ValueError, match="String should match pattern"):
        ChatRequest(
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "a b"}}],
        )


def test_hermes_reads_content_then_calls():
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    content, calls = parse("hermes", text)
    assert content == "Let me look.\n"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("now", {}),
    ]
    assert parse("hermes", "no calls here") == ("no calls here", [])
    broken = 'x <tool_call>{"name": "now", "arguments": {</tool_call>'
    assert parse("hermes", broken) == (broken, [])  # half a call is no call
    # a call whose closing tag max_tokens cut off still parses when its JSON is whole
    assert [c.name for c in parse("hermes", '<tool_call>{"name": "now", "arguments": {}}')[1]] == ["now"]
    # ... also when it was cut inside the closing tag (vLLM's parser reads an open last call the same way)
    for cut in ("\n</", "\n</tool_c", "</tool_call"):
        content, calls = parse("hermes", 'Sure. <tool_call>\n{"name": "now", "arguments": {"a": 1}}' + cut)
        assert content == "Sure. " and [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("now", {"a": 1})
        ]
    cut_json = 'Sure. <tool_call>{"name": "now", "arguments": {"a": 1</tool_c'
    assert parse("hermes", cut_json) == (cut_json, [])


def test_llama3_json_reads_calls_at_the_start_only():
    content, calls = parse(
        "llama3_json",
        ' {"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "now", "parameters": {}}',
    )
    assert content is None and [c.name for c in calls] == ["get_weather", "now"]
    assert json.loads(calls[0].arguments) == {"city": "Oslo"}
    tagged = parse("llama3_json", '<|python_tag|>{"name": "now", "arguments": "{}"}')[1]
    assert [(c.name, c.arguments) for c in tagged] == [("now", "{}")]
    for text in (
        'The answer is {"name": "now"}',
        '{"name": "now", "parameters": {}} and more',
        '{"city": 1}',
    ):
        assert parse("llama3_json", text) == (text, [])


def test_pythonic_reads_a_list_of_calls_and_runs_nothing():
    content, calls = parse("pythonic", ' [get_weather(city="Oslo", days=[1, 2], opts={"a": None}), now()] ')
    assert content is None and [c.name for c in calls] == ["get_weather", "now"]
    assert json.loads(calls[0].arguments) == {"city": "Oslo", "days": [1, 2], "opts": {"a": None}}
    assert json.loads(calls[1].arguments) == {}
    # Llama 4 wraps its calls in tags (vLLM's llama4_pythonic is the same parser); a dotted name is a name
    for parser in ("pythonic", "llama4_pythonic"):
        tagged = parse(parser, "<|python_start|>[tools.now(tz='UTC')]<|python_end|>")[1]
        assert [(c.name, json.loads(c.arguments)) for c in tagged] == [("tools.now", {"tz": "UTC"})]
    for text in (
        "Sure, [now()] is what I would call",  # calls must come first
        "[now()] and more",
        "[]",
        "[now]",  # a name, not a call
        "[now(1)]",  # positional arguments have no names to send
        "[now(**opts)]",
        "[now(x=open('f'))]",  # not a literal: never evaluated
        "[now(x={1, 2})]",  # a set is not JSON
        "[now(x=float('nan'))]",
        "[now(x=" + "[" * 300 + "]" * 300 + ")]",
        "[now(",
        "[1, 2]",
        '[f(x="\\ud800")]',  # a lone surrogate: no UTF-8 to send
    ):
        assert parse("pythonic", text) == (text, []), text
    # A chain of attributes past the recursion limit is a name, read without recursion.
    deep = parse("pythonic", "[a" + ".b" * 1500 + "()]")[1]
    assert [c.name for c in deep] == ["a" + ".b" * 1500]


def _stream(p: ToolPlan, pieces: list[str]) -> tuple[str, list[dict]]:
    s, content, deltas = ToolStream(p), "", []
    for i, piece in enumerate(pieces):
        c, d = s.feed(piece, i == len(pieces) - 1)
        content += c
        deltas += d
    return content, deltas


def test_a_hermes_stream_holds_back_what_may_begin_a_call():
    p = ToolPlan("auto", parser="hermes")
    text = 'Sure. <tool_call>{"name": "now", "arguments": {}}</tool_call>'
    s = ToolStream(p)
    assert s.feed("Sure. <tool", False) == ("Sure. ", [])  # "<tool" could be the marker's start
    assert s.feed("_call>{", False) == ("", [])
    content, deltas = s.feed(text[len("Sure. <tool_call>{") :], True)
    assert content == "" and [d["function"]["name"] for d in deltas] == ["now"] and deltas[0]["index"] == 0
    assert s.calls and p.finish_reason("stop", s.calls) == "tool_calls"
    # character by character, the same content and call
    content, deltas = _stream(p, list(text))
    assert content == "Sure. " and json.loads(deltas[0]["function"]["arguments"]) == {}
    # a reply that only looked like it might call: all of it is content in the end
    assert _stream(p, ["a <tool", "box> b <tool"]) == ("a <toolbox> b <tool", [])
    assert _stream(p, ["x <tool_call>{bad json", "}"]) == ("x <tool_call>{bad json}", [])
    assert _stream(p, [" ", "<tool_call>"]) == (" <tool_call>", [])  # whitespace held, then no call


def test_a_llama3_stream_decides_at_its_first_character():
    p = ToolPlan("auto", parser="llama3_json")
    content, deltas = _stream(p, ["  ", '{"name": "now", ', '"parameters": {}}'])
    assert content == "" and [d["function"]["name"] for d in deltas] == ["now"]
    assert _stream(p, ["  ", "Hello", " there"]) == ("  Hello there", [])


def test_a_pythonic_stream_decides_at_its_first_character():
    p = ToolPlan("auto", parser="pythonic")
    content, deltas = _stream(p, ["  ", "[now(", "tz='UTC'", ")]"])
    assert content == "" and [(d["function"]["name"], d["function"]["arguments"]) for d in deltas] == [
        ("now", '{"tz": "UTC"}')
    ]
    assert _stream(p, ["<|python", "_start|>[now()]<|python_end|>"])[1][0]["function"]["name"] == "now"
    assert _stream(p, ["Hello", " [there]"]) == ("Hello [there]", [])
    assert _stream(p, ["[a link](x)"]) == ("[a link](x)", [])  # looked like a call, was content


def test_named_and_required_streams():
    named = ToolPlan("named", name="now", schema={})
    content, deltas = _stream(named, ['{"a"', ": 1", "}"])
    assert content == "" and deltas[0]["function"]["name"] == "now" and deltas[0]["id"].startswith("call_")
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"a": 1}'
    assert all("name" not in d["function"] for d in deltas[1:])
    required = ToolPlan("required", schema={})
    content, deltas = _stream(required, ['[{"name": "now", ', '"parameters": {"x": 2}}]'])
    assert content == "" and [(d["function"]["name"], d["function"]["arguments"]) for d in deltas] == [
        ("now", '{"x": 2}')
    ]


def test_parallel_tool_calls_false_keeps_the_first_auto_call():
    p = ToolPlan("auto", parser="llama3_json", parallel=False)
    content, calls = p.extract('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}')
    assert content is None and [c.name for c in calls] == ["a"]


def test_an_earlier_calls_arguments_reach_the_template_as_an_object():
    call = {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": '{"tz": "UTC"}'}}
    body = ChatRequest(
        messages=[{"role": "user", "content": "t?"}, {"role": "assistant", "tool_calls": [call]}]
    )
    sent = body.template_messages()[1]["tool_calls"][0]
    assert sent["function"]["arguments"] == {"tz": "UTC"} and sent["id"] == "call_1"
    odd = {**call, "function": {"name": "now", "arguments": "not json"}}
    body = ChatRequest(messages=[{"role": "assistant", "tool_calls": [odd]}])
    assert body.template_messages()[0]["tool_calls"][0]["function"]["arguments"] == "not json"


PIECES = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<tool", "_call>", '{"name": "now", "arguments": {}}', '{"name": "a", ',
     '"parameters": {"x": 1}}', ";", " ", "\n", "hi", "{", "}", "<|python_tag|>", "[", "]", "now()",
     'a(x=1)', ", ", "<|python_start|>", "<|python_end|>"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    parser=st.sampled_from(["hermes", "llama3_json", "pythonic", "llama4_pythonic"]),
    words=st.lists(PIECES, max_size=10),
    data=st.data(),
)
def test_an_auto_stream_cut_anywhere_gives_the_whole_replys_calls(parser, words, data):
    text = "".join(words)
    pieces = cut_anywhere(data, text)
    p = ToolPlan("auto", parser=parser)
    content, deltas = _stream(p, pieces or [""])
    want_content, want_calls = p.extract(text)
    assert [(d["function"]["name"], d["function"]["arguments"]) for d in deltas] == [
        (c.name, c.arguments) for c in want_calls
    ]
    assert content == ((want_content or "") if want_calls else text)


def test_required_moves_each_tools_definitions_to_the_root():
    person = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    greet = {
        "type": "function",
        "function": {
            "name": "greet",
            "parameters": {
                "type": "object",
                "properties": {"who": {"$ref": "#/$defs/Person"}},
                "$defs": {"Person": person},
            },
        },
    }
    body = ChatRequest(
        messages=[{"role": "user", "content": "hi"}], tools=[greet, CLOCK], tool_choice="required"
    )
    schema = plan(body, None).schema
    assert schema["$defs"] == {"Person": person} and "definitions" not in schema
    jsonschema.validate([{"name": "greet", "parameters": {"who": {"name": "Ada"}}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "greet", "parameters": {"who": {"age": 3}}}], schema)
    other = {**greet, "function": {**greet["function"], "name": "meet"}}
    other["function"]["parameters"] = {
        **greet["function"]["parameters"],
        "$defs": {"Person": {"type": "string"}},
    }
    clash = ChatRequest(
        messages=[{"role": "user", "content": "hi"}], tools=[greet, other], tool_choice="required"
    )
    with pytest.raises(
        RequestInvalid, match=r"tools\[1\].function.parameters: \$defs 'Person' differs"
    ) as info:
        plan(clash, None)
    assert info.value.param == "tools"


def test_what_is_not_strict_json_is_no_call():
    deep = "[" * 5000
    for parser, text in [
        ("hermes", f"<tool_call>{deep}"),
        ("hermes", '<tool_call>{"name": "a", "arguments": {"x": NaN}}</tool_call>'),
        ("llama3_json", '{"name": "a", "parameters": {"x": Infinity}}'),
        ("llama3_json", deep),
    ]:
        assert parse(parser, text) == (text, []), text[:40]
    assert ToolPlan("required", schema={}).extract(deep) == (deep, [])
    call = {"type": "function", "function": {"name": "now", "arguments": deep}}
    body = ChatRequest(messages=[{"role": "assistant", "tool_calls": [call]}])
    assert body.template_messages()[0]["tool_calls"][0]["function"]["arguments"] == deep


def test_a_llama3_stream_that_starts_with_a_tag_is_sent_once_it_is_not_the_python_tag():
    s = ToolStream(ToolPlan("auto", parser="llama3_json"))
    assert s.feed("<", False) == ("", [])
    assert s.feed("b>bold</b>", False) == ("<b>bold</b>", [])


def test_type_defaults_to_function_as_in_vllm():
    body = ChatRequest(
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"function": {"name": "now"}}],
        tool_choice={"function": {"name": "now"}},
    )
    assert plan(body, None).mode == "named" and body.template_tools() == [
        {"type": "function", "function": {"name": "now"}}
    ]
