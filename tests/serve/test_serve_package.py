"""A generated package serves its compiled executor: `python -m <package> serve`, named by its manifest."""

import os

import httpx
import pytest
from serve_helpers import client, free_port, subprocess_server

from fastpath.compiler import build_package, render, resolve, write_package
from fastpath.runtime import SamplingParams
from fastpath.schema import parse_manifest

MANIFEST = """\
schema_version: 1
name: served-tiny
model:
  checkpoint: {checkpoint}
runtime: {{device: cpu, max_seq_len: 256, max_batch_size: 4}}
serve:
  served_model_name: acme/tiny-chat
  port: {port}
  max_tokens: 32
"""


@pytest.mark.slow
def test_a_generated_package_serves_its_manifests_model(tiny_text_checkpoint, tmp_path, llm):
    port = free_port()
    text = MANIFEST.format(checkpoint=tiny_text_checkpoint, port=port)
    plan = resolve(parse_manifest(text, "served.yaml"), "served.yaml")
    folder = tmp_path / plan.name
    write_package(render(plan), folder)
    build_package(folder, plan.package)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    # The port comes from the manifest's serve section: no --port flag.
    with subprocess_server(["-m", plan.package, "serve"], port, tmp_path / "server.log", env=env):
        url = f"http://127.0.0.1:{port}"
        api = client(url)
        assert [m.id for m in api.models.list().data] == ["acme/tiny-chat"]
        messages = [{"role": "user", "content": "hello"}]
        r = api.chat.completions.create(
            model="acme/tiny-chat",
            messages=messages,
            temperature=0,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        assert r.usage.completion_tokens == 32, "the manifest's max_tokens is the default"
        expected = llm.chat(
            messages, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True), use_tqdm=False
        )[0]
        assert r.choices[0].token_ids == expected.outputs[0].token_ids
        too_many = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 33}, timeout=30)
        assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "max_tokens"
    log = (tmp_path / "server.log").read_text()
    assert "executor served_tiny.executor.Executor" in log, "the package's compiled executor serves"
