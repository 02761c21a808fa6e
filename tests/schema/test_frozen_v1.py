"""API stability, as TensorRT-LLM keeps it for its LLM arguments: a v1 manifest written once keeps
validating, to the same values, in every later fastpath."""

import hashlib
from pathlib import Path

from fastpath.schema import load_manifest

FROZEN = Path(__file__).parent / "frozen" / "v1_every_key.yaml"
FROZEN_SHA256 = "538e5b4cbcb01670b2b87643cf430e40858c4d96a422352a45a588683b9a0537"


def test_the_frozen_manifest_is_untouched():
    assert hashlib.sha256(FROZEN.read_bytes()).hexdigest() == FROZEN_SHA256, "never edit the frozen manifest"


def test_a_v1_manifest_with_every_key_still_validates_to_the_same_values():
    m = load_manifest(FROZEN).manifest
    assert (m.schema_version, m.name) == (1, "frozen-v1")
    assert (m.model.checkpoint, m.model.dtype, m.model.seed) == ("random:tiny-qwen3", "bfloat16", 7)
    runtime = m.runtime
    assert (runtime.device, runtime.max_batch_size, runtime.max_seq_len) == ("cuda", 8, 1024)
    assert (runtime.cuda_graphs.enabled, runtime.cuda_graphs.batch_sizes) == (True, (1, 2, 8))
    assert runtime.tensor_parallel_size == 2  # spelled `tp`
    hooks = m.hooks
    assert hooks.loop_on_execution_stream is True
    assert hooks.decode_prologue == "fastpath.runtime.prologues:FusedDecodePrologue"
    assert hooks.executor_events.after_warmup == ("fastpath.runtime.events:retain_host_pages",)
    assert hooks.executor_events.before_overlap_loop == ("mypkg.hooks:before_loop",)
    assert hooks.executor_events.at_shutdown == ("fastpath.runtime.events:health_check",)
    assert (m.host_dispatch.mode, m.host_dispatch.on_unsupported) == ("spin", "error")
    assert (m.fmha.prepend, m.fmha.enabled) == (("flex_attention",), ("sdpa_flash", "sdpa_math", "reference"))
    assert m.guided_decoding.backend == "none"
