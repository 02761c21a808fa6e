"""vLLM's server flags for where it sits: HTTPS (--ssl-keyfile, --ssl-certfile), a proxy's path
prefix (--root-path), and the role chat replies carry (--response-role)."""

import shutil
import ssl
import subprocess

import httpx
import pytest
from serve_helpers import client, metric, running

from fastpath.runtime.serve import ServeConfig

openssl = shutil.which("openssl")


@pytest.fixture(scope="module")
def pem(tmp_path_factory):
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return key, cert


def test_https_serves_with_the_certificate_and_plain_http_is_not_answered(llm, pem):
    key, cert = pem
    with running(llm, ssl_keyfile=str(key), ssl_certfile=str(cert)) as url:
        https = url.replace("http://", "https://")
        with httpx.Client(verify=ssl.create_default_context(cafile=str(cert)), timeout=30) as tls:
            assert tls.get(f"{https}/v1/models").json()["data"][0]["id"] == "tiny"
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/v1/models", timeout=10)


def test_a_key_without_its_certificate_or_a_mismatched_pair_is_refused(pem, tmp_path):
    key, cert = pem
    with pytest.raises(ValueError, match="ssl_keyfile and ssl_certfile go together"):
        ServeConfig(ssl_keyfile=str(key))
    with pytest.raises(ValueError, match="do not load as a certificate chain and its key"):
        ServeConfig(ssl_keyfile=str(cert), ssl_certfile=str(cert))  # a certificate is no key
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="ssl_ca_certs .* holds no CA certificate"):
        ServeConfig(ssl_keyfile=str(key), ssl_certfile=str(cert), ssl_ca_certs=str(junk))


def test_a_root_path_serves_with_and_without_the_prefix_and_the_docs_name_it(llm):
    """vLLM's: the app's root_path, so a proxy may strip the prefix or keep it."""
    with running(llm, root_path="/llm") as url:
        for base in (f"{url}/llm", url):
            assert httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"] == "tiny", base
        assert client(f"{url}/llm").models.list().data[0].id == "tiny"
        spec = httpx.get(f"{url}/llm/openapi.json", timeout=30).json()
        assert spec["servers"] == [{"url": "/llm"}]
        assert metric(url, 'fastpath_http_requests_total{route="/v1/models",status="200"}') == 3


def test_chat_replies_carry_the_response_role_after_a_generation_prompt(llm):
    messages = [{"role": "user", "content": "Hi"}]
    with running(llm, response_role="bot") as url:
        chat = client(url).chat.completions
        whole = chat.create(model="tiny", messages=messages, max_tokens=3)
        assert whole.choices[0].message.role == "bot"
        opening = next(iter(chat.create(model="tiny", messages=messages, max_tokens=3, stream=True)))
        assert opening.choices[0].delta.role == "bot"
        # Without a generation prompt the reply continues the last message, in its role (vLLM's).
        body = {"model": "tiny", "messages": messages, "max_tokens": 3, "add_generation_prompt": False}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "user", r.text


def test_the_openapi_document_names_every_operation_once(llm):
    import warnings

    from fastpath.runtime.serve import build_app

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FastAPI warns of a duplicate operation id
        spec = build_app(llm, ServeConfig(), model_name="tiny").openapi()
    ids = [op["operationId"] for path in spec["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids)) and {"get", "head"} <= set(spec["paths"]["/health"])
