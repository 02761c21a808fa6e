"""Structured outputs through the server: response_format json_schema and json_object, vLLM's guided_*."""

import json

import jsonschema
import openai
import pytest
from serve_helpers import client, running

pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
    "required": ["color", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def url(llm):
    with running(llm) as url:
        yield url


def test_json_schema_outputs_validate(url):
    r = client(url).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "a color, as JSON"}],
        max_tokens=120,
        temperature=1.0,
        seed=3,
        n=4,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
    )
    finished = [c for c in r.choices if c.finish_reason == "stop"]
    assert len(finished) >= 3, [c.message.content for c in r.choices]
    for c in finished:
        jsonschema.validate(json.loads(c.message.content), SCHEMA)


def test_json_schema_streamed(url):
    stream = client(url).completions.create(
        model="tiny",
        prompt='{"name": "fastpath"',
        max_tokens=120,
        temperature=0,
        stream=True,
        # the client knows response_format for chat only; vLLM takes it on completions too
        extra_body={
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}
        },
    )
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads("".join(c.choices[0].text for c in chunks)), SCHEMA)


def test_guided_choice_and_regex(url):
    api = client(url)
    choice = api.completions.create(
        model="tiny", prompt="pick", max_tokens=10, extra_body={"guided_choice": ["alpha", 'say "β"\n']}
    )
    assert choice.choices[0].text in ("alpha", 'say "β"\n')
    regex = api.completions.create(
        model="tiny", prompt="code", max_tokens=10, seed=1, extra_body={"guided_regex": "[A-Z]{2}-[0-9]{3}"}
    )
    assert len(regex.choices[0].text) == 6 and regex.choices[0].text[2] == "-"


def test_json_object(url):
    r = client(url).completions.create(
        model="tiny",
        prompt="{",
        max_tokens=60,
        temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].text), dict)
    else:  # the random model may ramble past the bound; what it wrote still opens an object
        assert r.choices[0].text.lstrip().startswith("{")


def test_vllms_older_guided_options_reach_the_constraint(url):
    api = client(url)
    body = {"guided_regex": "[a-z]{4}", "guided_decoding_backend": "auto"}
    out = api.completions.create(model="tiny", prompt="word", max_tokens=8, extra_body=body)
    assert len(out.choices[0].text) == 4 and out.choices[0].text.isalpha()
    with pytest.raises(openai.BadRequestError) as err:
        api.completions.create(
            model="tiny", prompt="word", max_tokens=8,
            extra_body={"guided_regex": "[a-z]{4}", "guided_decoding_backend": "outlines"},
        )  # fmt: skip
    assert "outlines" in str(err.value)
