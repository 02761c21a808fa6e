"""A failing hook in a compiled package names the manifest line that declared it."""

import importlib.util

import pytest
from compile_helpers import compile_text

from fastpath.runtime import LLM, EngineClosedError, HookError, SamplingParams
from fastpath.runtime.engine.executor import ExecutorCore

FAILING = """\
schema_version: 1
name: failing
model: {checkpoint: "random:tiny-llama"}
runtime: {max_batch_size: 2, max_seq_len: 64}
hooks:
  decode_prologue: recording_hooks:ExplodingPrologue
  executor_events:
    after_warmup: [recording_hooks:after_warmup]
    at_shutdown:
      - recording_hooks:at_shutdown
      - recording_hooks:exploding_event
"""


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def _generated_executor(tmp_path, text, lock=None):
    """The rendered executor module, on the native extension (no C++ build: the Python is what is tested)."""
    _, files = compile_text(text, "deploy/failing.yaml")
    path = tmp_path / "failing_executor.py"
    path.write_text(files["failing/executor.py"])
    (tmp_path / "manifest.lock.json").write_text(lock or files["failing/manifest.lock.json"])  # the sites
    spec = importlib.util.spec_from_file_location("failing_executor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class OnTheNativeExtension(module.Executor):
        dispatch_extension = ExecutorCore.dispatch_extension

    return OnTheNativeExtension


def test_a_failing_compiled_hook_names_the_manifest_line_that_declared_it(tmp_path, caplog):
    """The at_shutdown hook then fails too: it is logged, and the prologue's error is the one raised."""
    executor = _generated_executor(tmp_path, FAILING)
    llm = LLM("random:tiny-llama", max_batch_size=2, max_seq_len=64, executor_cls=executor)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    with pytest.raises(HookError) as failed:
        llm.generate([[5, 6, 7]], params)
    line = _line(FAILING, "decode_prologue:")
    assert str(failed.value) == (
        f"decode_prologue hook recording_hooks:ExplodingPrologue (declared at deploy/failing.yaml:{line}) "
        "raised ValueError: planted prologue failure"
    )
    with pytest.raises(EngineClosedError, match=rf"HookError: .*failing\.yaml:{line}\)"):
        llm.generate([[5, 6, 7]], params)
    assert "shutting down after a failed step failed as well" in caplog.text
    assert "planted event failure" in caplog.text


def test_a_failing_event_hook_in_a_list_names_its_own_item_line(tmp_path):
    executor = _generated_executor(tmp_path, FAILING.replace("ExplodingPrologue", "CountingPrologue"))
    llm = LLM("random:tiny-llama", max_batch_size=2, max_seq_len=64, executor_cls=executor)
    llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    line = _line(FAILING, "- recording_hooks:exploding_event")
    with pytest.raises(HookError) as failed:
        llm.executor.shutdown()
    assert str(failed.value).startswith(
        f"executor_events.at_shutdown hook recording_hooks:exploding_event (declared at deploy/failing.yaml:{line}) "
        "raised ValueError"
    )


def test_a_comment_moves_the_sites_in_the_lock_and_leaves_the_code_and_version_alone():
    _, before = compile_text(FAILING, "deploy/failing.yaml")
    _, after = compile_text("# moved down a line\n" + FAILING, "deploy/failing.yaml")
    assert {path for path in before if before[path] != after[path]} == {
        "failing/__init__.py",
        "failing/manifest.lock.json",
    }
    line = _line(FAILING, "decode_prologue:")
    assert f'"deploy/failing.yaml:{line + 1}"' in after["failing/manifest.lock.json"]


def test_a_serve_default_changes_the_version_so_pip_installs_the_new_build():
    """The package reads its serve defaults (the API key's variable, the port) from the lock at run
    time: a build that changes them must not keep the version a deployed machine already has."""
    _, before = compile_text(FAILING, "deploy/failing.yaml")
    _, after = compile_text(FAILING + "serve:\n  api_key_env: MY_SECRET_KEY\n", "deploy/failing.yaml")
    version = [line for line in before["pyproject.toml"].splitlines() if line.startswith("version")]
    assert version and version[0] not in after["pyproject.toml"]


def test_without_the_lock_a_failing_hook_still_names_itself(tmp_path):
    executor = _generated_executor(tmp_path, FAILING, lock="{not json")
    llm = LLM("random:tiny-llama", max_batch_size=2, max_seq_len=64, executor_cls=executor)
    with pytest.raises(HookError, match=r"^decode_prologue hook recording_hooks:ExplodingPrologue raised"):
        llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
