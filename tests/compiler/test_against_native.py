"""A generated package against the native engine running the same manifest: same tokens, same hook order."""

import importlib
import sys

import pytest
import recording_hooks
from compile_helpers import REPO

from fastpath.compiler import build_package, native_llm, native_llm_from_text, render, resolve, write_package
from fastpath.runtime import SamplingParams
from fastpath.schema import load_manifest, parse_manifest

PROMPTS = [[5, 6, 7, 8], list(range(10, 60)), [3]]
PARAMS = [
    SamplingParams(max_tokens=n, ignore_eos=True, temperature=t, seed=4)
    for n, t in ((10, 0), (7, 1.0), (12, 0))
]

RECORDING = """\
schema_version: 1
name: recording
model: {checkpoint: "random:tiny-qwen3"}
runtime: {max_batch_size: 4, max_seq_len: 128}
hooks:
  loop_on_execution_stream: true
  decode_prologue: recording_hooks:CountingPrologue
  executor_events:
    after_warmup: [recording_hooks:after_warmup]
    before_overlap_loop: [recording_hooks:before_overlap_loop]
    at_shutdown: [recording_hooks:at_shutdown]
"""


def _import_generated(plan, root):
    """Compile, build in place with scikit-build-core, and import: what a user does with bin/compile --build."""
    folder = root / plan.name
    write_package(render(plan), folder)
    build_package(folder, plan.package)
    sys.path.insert(0, str(folder))
    try:
        sys.modules.pop(plan.package, None)
        return importlib.import_module(plan.package)
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("generated")


@pytest.mark.slow
@pytest.mark.parametrize("example", ["baseline", "fast-decode", "guided"])
def test_generated_package_gives_the_native_tokens(example, build_root):
    path = REPO / "examples" / f"{example}.yaml"
    plan = resolve(load_manifest(path), f"examples/{example}.yaml")
    pkg = _import_generated(plan, build_root)
    with pkg.LLM() as generated, native_llm(path) as native:
        assert type(generated.executor).__module__ == f"{plan.package}.executor"
        fixed = generated.executor.dispatcher.extension.FIXED_MODE
        assert fixed == plan.dispatch_mode
        expected = [o.outputs[0].token_ids for o in native.generate(PROMPTS, PARAMS)]
        assert [o.outputs[0].token_ids for o in generated.generate(PROMPTS, PARAMS)] == expected


@pytest.mark.slow
def test_generated_and_native_run_the_hooks_in_the_same_order(build_root):
    sys.path.insert(0, str(REPO / "tests" / "compiler"))
    plan = resolve(parse_manifest(RECORDING, "recording.yaml"), "recording.yaml")
    pkg = _import_generated(plan, build_root)
    logs = {}
    for name, make in (("native", lambda: native_llm_from_text(RECORDING)), ("generated", pkg.LLM)):
        recording_hooks.LOG.clear()
        with make() as llm:
            tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]
            llm.generate(PROMPTS[:1], PARAMS[:1])
        logs[name] = (list(recording_hooks.LOG), tokens)
    assert logs["generated"] == logs["native"]
    log = logs["native"][0]
    events = [e for e in log if e != "prologue"]  # warmup's decode step already runs the prologue
    assert events[:2] == ["after_warmup guard=True", "before_overlap_loop"]
    assert events.count("before_overlap_loop") == 1 and events[-1].startswith("at_shutdown")
    assert log.count("prologue") > 10


@pytest.mark.slow
def test_generated_llm_refuses_to_override_what_is_compiled_in(build_root):
    plan = resolve(load_manifest(REPO / "examples/baseline.yaml"), "examples/baseline.yaml")
    pkg = _import_generated(plan, build_root)
    for name in ("hooks", "dispatch_mode"):
        with pytest.raises(TypeError, match=f"{name} is compiled into this package"):
            pkg.LLM(**{name: None})
