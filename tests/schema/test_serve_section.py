"""The manifest's optional `serve:` section: defaults, checks naming the key, and the lock carrying it."""

import pytest

from fastpath.compiler import resolve
from fastpath.schema import parse_manifest
from fastpath.schema.errors import ManifestError

BASE = "schema_version: 1\nname: my-model\nmodel:\n  checkpoint: random:tiny-llama\n"


def test_without_a_serve_section_the_lock_names_the_manifest_as_the_model():
    serve = resolve(parse_manifest(BASE, "m.yaml")).to_json()["serve"]
    assert serve["served_model_name"] == "my-model"
    assert (serve["host"], serve["port"], serve["api_key_env"]) == ("127.0.0.1", 8000, None)


def test_the_lock_carries_what_the_section_says():
    text = BASE + (
        "serve:\n  host: 0.0.0.0\n  port: 9001\n  served_model_name: acme/tiny\n  api_key_env: ACME_KEY\n"
        "  max_queued_requests: 4\n  max_tokens: 256\n  max_request_bytes: 65536\n  drain_timeout_s: 5\n"
        "  stream_interval: 4\n  api_server_count: 2\n  enable_auto_tool_choice: true\n"
        "  tool_call_parser: hermes\n  reasoning_parser: qwen3\n"
    )
    serve = resolve(parse_manifest(text, "m.yaml")).to_json()["serve"]
    assert serve == {
        "host": "0.0.0.0",
        "port": 9001,
        "served_model_name": "acme/tiny",
        "api_key_env": "ACME_KEY",
        "max_queued_requests": 4,
        "max_tokens": 256,
        "max_request_bytes": 65536,
        "drain_timeout_s": 5.0,
        "stream_interval": 4,
        "api_server_count": 2,
        "enable_auto_tool_choice": True,
        "tool_call_parser": "hermes",
        "reasoning_parser": "qwen3",
    }


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("port: 70000", "less than or equal to 65535"),
        ("port: '8000'", "valid integer"),
        ("host: 'a b'", "not a host name"),
        ("api_key_env: 1BAD-NAME", "pattern"),
        ("served_model_name: ''", "not blank"),
        ("max_tokens: 0", "greater than 0"),
        ("max_request_bytes: 10", "greater than or equal to 1024"),
        ("drain_timeout_s: -1", "greater than or equal to 0"),
        ("stream_interval: 65", "less than or equal to 64"),
        ("api_server_count: 0", "greater than 0"),
        (
            "enable_auto_tool_choice: true",
            "needs tool_call_parser (hermes, llama3_json, pythonic, llama4_pythonic)",
        ),
        ("tool_call_parser: mistral", "'hermes', 'llama3_json', 'pythonic' or 'llama4_pythonic'"),
        ("reasoning_parser: r1", "'deepseek_r1' or 'qwen3'"),
        ("api_key: sesame", "did you mean 'api_key_env'"),  # a secret never sits in a manifest
    ],
)
def test_a_bad_serve_value_is_an_error_at_its_line(line, words):
    with pytest.raises(ManifestError) as info:
        parse_manifest(BASE + "serve:\n  " + line + "\n", "m.yaml")
    message = str(info.value)
    assert message.startswith("m.yaml:6:"), message
    assert words in message
