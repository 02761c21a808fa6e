"""Shared by the compiler tests: the repo, its examples, and compiling a manifest given as text."""

from pathlib import Path

from fastpath.compiler import render, resolve
from fastpath.schema import parse_manifest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

# Every hook declared, with two callables of one attribute name: the most a manifest can ask for.
ALL_HOOKS = """\
schema_version: 1
name: all-hooks
model:
  checkpoint: random:tiny-llama
hooks:
  loop_on_execution_stream: true
  decode_prologue: fastpath.runtime.prologues:FusedDecodePrologue
  executor_events:
    after_warmup: [fastpath.runtime.events:retain_host_pages]
    before_overlap_loop: [mypkg.a:check]
    at_shutdown: [fastpath.runtime.events:health_check, mypkg.b:check]
host_dispatch: {mode: spin, on_unsupported: error}
fmha: {prepend: [flex_attention], enabled: [sdpa_math, reference]}
"""


def compile_text(text: str, manifest_path: str = "examples/test.yaml"):
    """(plan, files) of a manifest given as text."""
    plan = resolve(parse_manifest(text, manifest_path), manifest_path)
    return plan, render(plan)
