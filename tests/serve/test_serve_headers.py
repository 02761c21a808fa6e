"""Headers a gateway or a browser relies on: the client's X-Request-Id, and CORS where it is asked for."""

import httpx
import pytest
from serve_helpers import running

from fastpath.runtime.serve import ServeConfig

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
ORIGIN = "https://app.example.com"


@pytest.fixture(scope="module")
def url(llm):
    with running(llm, allowed_origins=(ORIGIN,)) as url:
        yield url


@pytest.mark.parametrize(("path", "body", "prefix"), [("/v1/chat/completions", CHAT, "chatcmpl"),
                                                      ("/v1/completions", COMPLETION, "cmpl")])  # fmt: skip
def test_the_clients_request_id_names_the_response_as_vllm_does(url, path, body, prefix):
    with httpx.Client(base_url=url, timeout=30) as http:
        # Twice with the same id (once streamed): both answered, each under the client's id.
        with httpx.Client(base_url=url, timeout=30) as other:
            a = http.post(path, json=body, headers={"X-Request-Id": "gw-42"})
            b = other.post(path, json={**body, "stream": True}, headers={"X-Request-Id": "gw-42"})
        assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
        assert a.json()["id"] == f"{prefix}-gw-42" and a.headers["x-request-id"] == "gw-42"  # echoed as sent
        assert f'"id":"{prefix}-gw-42"' in b.text.replace(" ", "")
        # One it cannot send back in a header, or none: a fresh id.
        for headers in ({"X-Request-Id": "x" * 200}, {"X-Request-Id": "two words"}, {}):
            r = http.post(path, json=body, headers=headers)
            assert r.status_code == 200 and r.json()["id"].startswith(f"{prefix}-")
            assert "gw-42" not in r.json()["id"] and r.headers["x-request-id"] == r.json()["id"]


def test_a_browser_preflight_from_an_allowed_origin_is_answered(url):
    with httpx.Client(base_url=url, timeout=30) as http:
        asked = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
        r = http.options("/v1/chat/completions", headers={"Origin": ORIGIN, **asked})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
        r = http.post("/v1/chat/completions", json=CHAT, headers={"Origin": ORIGIN})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
        assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
        r = http.options("/v1/chat/completions", headers={"Origin": "https://evil.example", **asked})
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers


def test_without_allowed_origins_no_page_gets_cors_headers(llm):
    with running(llm) as url, httpx.Client(base_url=url, timeout=30) as http:
        r = http.post("/v1/completions", json=COMPLETION, headers={"Origin": ORIGIN})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("origins", [("",), ("a b ",), ["*"], ("ok", 3)])
def test_bad_allowed_origins_are_refused_naming_the_option(origins):
    with pytest.raises(ValueError, match="allowed_origins"):
        ServeConfig(allowed_origins=origins)


def test_served_model_names_are_aliases_and_responses_carry_the_first(llm):
    names = ("llama-prod", "tiny", "default")
    with running(llm, served_model_name=names) as url, httpx.Client(base_url=url, timeout=30) as http:
        listed = http.get("/v1/models").json()["data"]
        assert [m["id"] for m in listed] == ["llama-prod", "tiny", "default"]
        assert http.get("/v1/models/default").json()["id"] == "default"
        for name in ("tiny", "default", None):
            body = (
                {**COMPLETION, "model": name}
                if name
                else {k: v for k, v in COMPLETION.items() if k != "model"}
            )
            r = http.post("/v1/completions", json=body)
            assert r.status_code == 200 and r.json()["model"] == "llama-prod", r.text
        r = http.post("/v1/completions", json={**COMPLETION, "model": "other"})
        assert r.status_code == 404 and "'llama-prod', 'tiny', 'default'" in r.json()["error"]["message"]
    for bad in ((), ("a", "a"), ("a", "")):
        with pytest.raises(ValueError, match="served_model_name"):
            ServeConfig(served_model_name=bad)
