"""vLLM's GuidedDecodingParams / StructuredOutputsParams fields beyond the constraint (backend, whitespace,
additional properties, fallback, structural tags), json_object as an object, and Lark grammars on xgrammar."""

import json
import pickle
import re

import pytest
from guided_cases import BACKENDS, PROMPTS

from fastpath.runtime import LLM, GuidedDecodingParams, RequestError, SamplingParams, StructuredOutputsParams
from fastpath.runtime.guided.lark_ebnf import lark_to_ebnf, to_ebnf
from fastpath.runtime.guided.spec import GrammarError, parse_spec

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "object", "properties": {"c": {}}}},
}
LARK = """
// a comment, and the shapes of the common subset
?start: greeting ("," NAME)* ["!"]
greeting: "hi" -> hi
    | "hello"
NAME: "a".."c"~1..3 DIGIT?
DIGIT: /[0-9]/
"""
LARK_VALID = ["hi", "hello,ab", "hi,abc1,c!", "hello!"]
LARK_INVALID = ["hey", "hi,", "hi,abcd", "hi,d", "hi!!"]
TAG = {
    "structures": [{"begin": "<f=a>", "schema": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}, "end": "</f>"}],
    "triggers": ["<f"],
}  # fmt: skip


# --- the params object -------------------------------------------------------------------------


def test_vllms_fields_are_accepted_and_structured_outputs_params_is_the_same_class():
    assert StructuredOutputsParams is GuidedDecodingParams
    p = GuidedDecodingParams(
        json=SCHEMA,
        backend="llguidance",
        disable_any_whitespace=True,
        disable_additional_properties=True,
        disable_fallback=True,
    )
    assert p.as_spec() == {
        "json_schema": SCHEMA,
        "backend": "llguidance",
        "disable_any_whitespace": True,
        "disable_additional_properties": True,
    }, "disable_fallback is a no-op: nothing of it reaches the engine"
    assert SamplingParams(guided_decoding=p).guided == p.as_spec()
    assert SamplingParams(structured_outputs={"regex": "a+", "backend": "auto"}).guided == {
        "regex": "a+",
        "backend": "auto",
    }


def test_the_new_fields_survive_pickling_and_count_in_equality_and_hashing():
    p = GuidedDecodingParams(json=SCHEMA, backend="xgrammar", whitespace_pattern=" ?", disable_fallback=True)
    again = pickle.loads(pickle.dumps(p))
    assert again == p and hash(again) == hash(p) and again.whitespace_pattern == " ?"
    assert p != GuidedDecodingParams(json=SCHEMA, backend="xgrammar", whitespace_pattern=" ?")
    same = {
        GuidedDecodingParams(choice=["a", "b"], backend="guidance"),
        GuidedDecodingParams(choice=("a", "b"), backend="guidance"),
    }
    assert len(same) == 1  # fmt: skip
    sp = pickle.loads(pickle.dumps(SamplingParams(guided_decoding=p)))
    assert parse_spec(sp.guided).whitespace_pattern == " ?" and parse_spec(sp.guided).backend == "xgrammar"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "outlines"}, "GuidedDecodingParams.backend must be one of auto, xgrammar, llguidance"),
        ({"backend": 3}, "GuidedDecodingParams.backend must be one of"),
        ({"disable_any_whitespace": "yes"}, "GuidedDecodingParams.disable_any_whitespace must be a bool"),
        (
            {"disable_additional_properties": None},
            "GuidedDecodingParams.disable_additional_properties must be",
        ),
        ({"disable_fallback": 1}, "GuidedDecodingParams.disable_fallback must be a bool"),
        ({"whitespace_pattern": 5}, "GuidedDecodingParams.whitespace_pattern must be a string"),
        (
            {"structural_tag": TAG},
            "set exactly one of json, json_object, regex, choice, grammar, structural_tag",
        ),
    ],
)
def test_a_bad_option_is_a_value_error_naming_its_field(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        GuidedDecodingParams(json=SCHEMA, **kwargs)


def test_a_whitespace_pattern_with_whitespace_disabled_is_refused_by_name():
    with pytest.raises(ValueError, match="whitespace_pattern and disable_any_whitespace=True"):
        SamplingParams(
            guided_decoding=GuidedDecodingParams(
                json=SCHEMA, whitespace_pattern=" ", disable_any_whitespace=True
            )
        )


def test_whitespace_is_compact_unless_asked_and_only_json_kinds_carry_it():
    compact = parse_spec({"json_schema": SCHEMA})
    assert parse_spec({"json_schema": SCHEMA, "disable_any_whitespace": True}) == compact
    assert not compact.any_whitespace and compact.whitespace_pattern is None
    assert parse_spec({"json_object": True, "disable_any_whitespace": False}).any_whitespace, "vLLM's default"
    assert parse_spec({"json_schema": SCHEMA, "whitespace_pattern": "[ ]?"}).key != compact.key
    assert parse_spec({"regex": "a", "disable_any_whitespace": False}) == parse_spec({"regex": "a"})


def test_disable_additional_properties_closes_every_object_that_lists_properties():
    open_ = {
        **SCHEMA,
        "properties": {**SCHEMA["properties"], "d": {"type": "object", "additionalProperties": True}},
    }
    spec = parse_spec({"json_schema": open_, "disable_additional_properties": True})
    schema = json.loads(spec.source)
    assert schema["additionalProperties"] is False
    assert schema["properties"]["b"]["additionalProperties"] is False
    assert schema["properties"]["d"]["additionalProperties"] is True, "an explicit value stays"
    assert "additionalProperties" not in schema["properties"]["a"], "no properties listed: left alone"
    assert list(schema["properties"]) == ["a", "b", "d"], "properties keep their order"
    assert parse_spec({"json_schema": open_}).source == json.dumps(open_, separators=(",", ":"))


def test_backend_names_are_vllms():
    assert parse_spec({"regex": "a", "backend": "guidance"}).backend == "llguidance"
    assert parse_spec({"regex": "a", "backend": None}).backend == "auto"
    with pytest.raises(ValueError, match="guided: backend must be one of"):
        parse_spec({"regex": "a", "backend": "lm-format-enforcer"})


def test_the_http_structured_outputs_object_takes_the_same_fields():
    from fastpath.runtime.serve.errors import RequestInvalid
    from fastpath.runtime.serve.params import sampling_params
    from fastpath.runtime.serve.protocol import CompletionRequest

    body = {"json": SCHEMA, "backend": "xgrammar", "disable_any_whitespace": False, "disable_fallback": True}
    req = CompletionRequest(prompt="x", structured_outputs=body)
    guided = sampling_params(req, None).guided
    assert guided == {"json_schema": SCHEMA, "backend": "xgrammar", "disable_any_whitespace": False}
    req = CompletionRequest(prompt="x", structured_outputs={"structural_tag": json.dumps(TAG)})
    assert sampling_params(req, None).guided == {"structural_tag": json.dumps(TAG)}
    req = CompletionRequest(prompt="x", structured_outputs={"regex": "a", "backend": "outlines"})
    with pytest.raises(RequestInvalid, match=r"^structured_outputs\.backend must be one of") as info:
        sampling_params(req, None)
    assert info.value.param == "structured_outputs"


# --- Lark -> xgrammar EBNF ------------------------------------------------------------------------


def test_lark_converts_to_ebnf_and_ebnf_stays_as_it_is():
    assert lark_to_ebnf('start: "ab" | "cd"') == 'root ::= "ab" | "cd"'
    assert lark_to_ebnf(LARK).splitlines() == [
        'root ::= greeting ("," NAME)* ("!")?',
        'greeting ::= "hi" | "hello"',
        "NAME ::= [a-c]{1,3} DIGIT?",
        'DIGIT ::= Regex("[0-9]")',
    ]
    assert lark_to_ebnf('start: root "\\"x"\nroot: "r"') == 'root ::= root_ "\\"x"\nroot_ ::= "r"'
    ebnf = 'root ::= "a" | b\nb ::= "c"'
    assert to_ebnf(ebnf) is ebnf


@pytest.mark.parametrize(
    ("lark", "what"),
    [
        ('%import common.WS\nstart: "a"', "'%import' at line 1"),
        ('start: "a"\n%ignore " "', "'%ignore' at line 2"),
        ('start: "a"i', "the string flag 'i'"),
        ("start: /a/i", "the regex flag 'i'"),
        ('start.2: "a"', "'.' at line 1"),
        ("start: _sep{x}", "'{' at line 1"),
        ('name: "a"', "no `start` rule"),
        ('start: ("a"', "unexpected end of rule at line 1"),
        ('start: "a"\nstart: "b"', "'start' is defined twice"),
        ('start: "ab".."c"', 'a range "a".."z" takes one character at each end'),
        ("start: " + "(" * 100 + '"a"' + ")" * 100, "parentheses nest deeper than 64"),
    ],
)
def test_lark_outside_the_subset_is_a_value_error_that_names_grammar_and_llguidance(lark, what):
    with pytest.raises(GrammarError) as info:
        to_ebnf(lark)
    message = str(info.value)
    assert message.startswith(f"guided grammar: {what}"), message
    assert "guided_backend='llguidance'" in message


# --- the backends, below the engine ---------------------------------------------------------------


def _accepts(decoder, tokenizer, spec, text):
    """Whether `spec`'s matcher takes `text` along the tokenizer's own path, and then the end token."""
    row = decoder.state_for(spec).row
    for token in [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]:
        row.accept(token)
    return row.error is None and row.terminated


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lark_grammar_means_the_same_on_each_backend(decoders, tokenizer, backend):
    g = decoders(backend)
    for text in LARK_VALID:
        assert _accepts(g, tokenizer, {"grammar": LARK}, text), text
    for text in LARK_INVALID:
        assert not _accepts(g, tokenizer, {"grammar": LARK}, text), text


@pytest.mark.parametrize("backend", BACKENDS)
def test_json_object_takes_objects_only_with_the_whitespace_asked_for(decoders, tokenizer, backend):
    g = decoders(backend)
    obj, loose = {"json_object": True}, {"json_object": True, "disable_any_whitespace": False}
    assert _accepts(g, tokenizer, obj, '{"a": [1, 2]}')
    for text in ("[1, 2]", "1", '"a"', '{"a":1}', '{ "a": 1}', '{"a": 1}\n'):
        assert not _accepts(g, tokenizer, obj, text), text
    assert _accepts(g, tokenizer, loose, '{ "a" :1,\n"b":\t2 }')
    assert not _accepts(g, tokenizer, loose, "[1]")


@pytest.mark.parametrize("backend", BACKENDS)
def test_whitespace_pattern_is_llguidances_and_xgrammar_refuses_it_by_name(decoders, tokenizer, backend):
    g = decoders(backend)
    spec = {"json_schema": {"type": "object"}, "whitespace_pattern": "[ ]?"}
    if backend == "xgrammar":
        with pytest.raises(GrammarError, match="^guided whitespace_pattern is not supported by xgrammar"):
            g.state_for(spec)
        return
    for text in ('{"a":1}', '{ "a" : 1 }', '{"a": 1, "b":2}'):
        assert _accepts(g, tokenizer, spec, text), text
    assert not _accepts(g, tokenizer, spec, '{"a":  1}')


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["dict", "text"])
def test_a_structural_tag_holds_its_schema_between_begin_and_end(decoders, tokenizer, backend, form):
    g = decoders(backend)
    spec = {"structural_tag": TAG if form == "dict" else json.dumps(TAG)}
    assert _accepts(g, tokenizer, spec, 'free text <f=a>{"x": 1}</f> and more')
    assert not _accepts(g, tokenizer, spec, 'free text <f=a>{"y": 1}</f>')


@pytest.mark.parametrize("backend", BACKENDS)
def test_xgrammar_also_takes_its_own_structural_tag_form_and_llguidance_says_it_does_not(
    decoders, tokenizer, backend
):
    tag = {
        "type": "structural_tag",
        "format": {"type": "triggered_tags", "triggers": ["<f"], "tags": [{"type": "tag", "begin": "<f=a>", "content": {"type": "json_schema", "json_schema": TAG["structures"][0]["schema"]}, "end": "</f>"}]},
    }  # fmt: skip
    g = decoders(backend)
    if backend == "xgrammar":
        assert _accepts(g, tokenizer, {"structural_tag": tag}, 'a <f=a>{"x": 2}</f>')
        assert not _accepts(g, tokenizer, {"structural_tag": tag}, 'a <f=a>{"x": "2"}</f>')
        return
    with pytest.raises(GrammarError, match="llguidance takes the {'structures', 'triggers'} form"):
        g.state_for({"structural_tag": tag})


# --- end to end -----------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def llm(request, tiny_text_checkpoint):
    engine = LLM(
        str(tiny_text_checkpoint),
        device="cpu",
        max_seq_len=320,
        max_batch_size=8,
        guided_backend=request.param,
    )
    yield engine
    engine.close()


def _outputs(llm, params, prompts=PROMPTS):
    return [o.outputs[0] for o in llm.generate(prompts, params)]


def test_json_object_output_is_a_json_object(llm):
    """Greedy, as the audit's xgrammar run that wrote '[ 19966\\t\\n\\t,0 ...': an object, compact."""
    outs = _outputs(llm, SamplingParams(temperature=0, max_tokens=60, guided_decoding={"json_object": True}))
    assert any(o.finish_reason == "stop" for o in outs), [o.text for o in outs]
    for o in outs:
        assert o.text.startswith("{") and not re.search(r"[\t\n\r]", o.text), o.text
        if o.finish_reason == "stop":
            assert isinstance(json.loads(o.text), dict), o.text


def test_the_same_lark_grammar_runs_on_either_backend(llm):
    params = [SamplingParams(seed=s, max_tokens=20, guided_decoding={"grammar": LARK}) for s in range(4)]
    outs = _outputs(llm, params)
    assert [o.finish_reason for o in outs] == ["stop"] * 4
    pattern = r"(hi|hello)(,[a-c]{1,3}[0-9]?)*!?"
    assert all(re.fullmatch(pattern, o.text) for o in outs), [o.text for o in outs]
    outs = _outputs(
        llm, SamplingParams(seed=1, max_tokens=8, guided_decoding={"grammar": 'start: "ab" | "cd"'})
    )
    assert {o.text for o in outs} <= {"ab", "cd"}


def test_a_request_names_the_engines_backend_or_fails_naming_the_one_available(llm):
    own = llm.executor.guided.backend.name
    other = "llguidance" if own == "xgrammar" else "xgrammar"
    for backend in ("auto", own, "guidance" if own == "llguidance" else own):
        p = SamplingParams(
            max_tokens=8, guided_decoding=GuidedDecodingParams(choice=["yes", "no"], backend=backend)
        )
        assert _outputs(llm, p, PROMPTS[:1])[0].text in ("yes", "no")
    p = SamplingParams(
        max_tokens=8, guided_decoding=GuidedDecodingParams(choice=["yes", "no"], backend=other)
    )
    with pytest.raises(
        RequestError, match=rf"guided: backend '{other}' is not available .*available: 'auto', '{own}'"
    ):
        llm.generate(PROMPTS[:1], p)
