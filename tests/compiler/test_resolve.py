"""resolve: every default filled, every gate decided with its reason, the lock deterministic."""

import json

import pytest

from fastpath.compiler.plan import LLM_KWARGS
from fastpath.compiler.render import lock_json
from fastpath.compiler.resolve import resolve
from fastpath.schema import DEFAULT_FMHA_ORDER, ManifestError, parse_manifest
from fastpath.vocab import default_graph_batch_sizes

HEAD = "schema_version: 1\nname: m\nmodel:\n  checkpoint: random:tiny-llama\n"


def plan_of(body: str = "", path: str | None = None):
    return resolve(parse_manifest(HEAD + body, "m.yaml"), path)


def decision(plan, subject):
    (d,) = [d for d in plan.decisions if d.subject == subject]
    return d


def test_llm_kwargs_are_plain_values_under_exactly_the_runtime_keys():
    kwargs = plan_of().llm_kwargs()
    assert tuple(kwargs) == LLM_KWARGS
    assert kwargs == {
        "model": "random:tiny-llama",
        "dtype": "float32",
        "device": "auto",
        "max_batch_size": 16,
        "max_seq_len": 2048,
        "cuda_graphs": None,
        "graph_batch_sizes": (1, 2, 4, 8, 16),
        "fmha_prepend": (),
        "fmha_enabled": None,
        "dispatch_mode": "auto",
        "on_unsupported": "warn_once",
        "guided_backend": "none",
        "tensor_parallel_size": 1,
        "seed": 0,
    }


def test_undeclared_hooks_are_off_and_say_so():
    plan = plan_of()
    assert plan.hooks_dict() == {
        "loop_on_execution_stream": False,
        "decode_prologue": None,
        "executor_events": {"after_warmup": [], "before_overlap_loop": [], "at_shutdown": []},
    }
    assert plan.hooks.declared() == {}
    for d in plan.decisions:
        if d.subject.startswith("hooks."):
            assert (d.value, d.reason) == ("off", "not declared: off by default")


def test_declared_hooks_are_split_into_identifiers_and_cite_their_line():
    plan = plan_of(
        "hooks:\n"
        "  loop_on_execution_stream: true\n"
        "  decode_prologue: pkg.mod:Prologue\n"
        "  executor_events:\n"
        "    at_shutdown: [pkg.health:check, other:check]\n"
    )
    assert (plan.hooks.decode_prologue.module, plan.hooks.decode_prologue.attr) == ("pkg.mod", "Prologue")
    assert [h.path for h in plan.hooks.at_shutdown] == ["pkg.health:check", "other:check"]
    assert decision(plan, "hooks.decode_prologue").reason == "pkg.mod:Prologue, declared at line 7"
    loop = decision(plan, "hooks.loop_on_execution_stream")
    assert loop.value == "on" and "line 6" in loop.reason and "no-op when CUDA is absent" in loop.reason
    assert plan.hooks.declared() == {
        "loop_on_execution_stream": True,
        "decode_prologue": "pkg.mod:Prologue",
        "executor_events": {"at_shutdown": ["pkg.health:check", "other:check"]},
    }


def test_a_hook_declared_off_says_where():
    plan = plan_of("hooks:\n  loop_on_execution_stream: false\n")
    assert decision(plan, "hooks.loop_on_execution_stream").reason == "declared off at line 6"


def test_the_execution_stream_loop_on_cpu_is_a_run_time_no_op():
    plan = plan_of("runtime:\n  device: cpu\nhooks:\n  loop_on_execution_stream: true\n")
    assert "no-op at run time on cpu" in decision(plan, "hooks.loop_on_execution_stream").reason


@pytest.mark.parametrize(
    ("runtime", "graphs", "sizes", "reason"),
    [
        ("device: auto", None, (1, 2, 4, 8, 16), "auto: on when CUDA is present at run time"),
        ("device: cuda", True, (1, 2, 4, 8, 16), "auto: on, because device is cuda"),
        ("device: cpu", False, None, "auto: off, because device is cpu"),
        ("cuda_graphs: {enabled: false}", False, None, "declared off at line 6"),
        ("cuda_graphs: {enabled: true, batch_sizes: [2, 3]}", True, (2, 3), "declared on at line 6"),
    ],
)
def test_cuda_graph_gate(runtime, graphs, sizes, reason):
    plan = plan_of(f"runtime:\n  {runtime}\n")
    assert (plan.cuda_graphs, plan.graph_batch_sizes) == (graphs, sizes)
    assert decision(plan, "cuda_graphs").reason.startswith(reason)


@pytest.mark.parametrize(
    ("max_batch", "sizes"), [(1, (1,)), (2, (1, 2)), (12, (1, 2, 4, 8, 12)), (16, (1, 2, 4, 8, 16))]
)
def test_default_graph_batch_sizes(max_batch, sizes):
    assert default_graph_batch_sizes(max_batch) == sizes


@pytest.mark.parametrize(
    ("fmha", "order"),
    [
        ("", DEFAULT_FMHA_ORDER),
        ("prepend: [reference]", ("reference", *(n for n in DEFAULT_FMHA_ORDER if n != "reference"))),
        ("enabled: [sdpa_math, reference]", ("sdpa_math", "reference")),
        ("{prepend: [flex_attention], enabled: [sdpa_math]}", ("flex_attention", "sdpa_math")),
    ],
)
def test_fmha_order_is_prepend_then_enabled_or_the_default_order(fmha, order):
    plan = plan_of(f"fmha: {fmha}\n" if fmha.startswith("{") else f"fmha:\n  {fmha}\n" if fmha else "")
    assert plan.fmha_order == order


def test_the_default_fmha_order_is_the_runtimes():
    from fastpath.runtime.attention.registry import DEFAULT_ORDER, LIBRARIES
    from fastpath.schema import FMHA_LIBRARIES

    assert DEFAULT_FMHA_ORDER == DEFAULT_ORDER
    assert set(FMHA_LIBRARIES) == set(LIBRARIES)


@pytest.mark.parametrize(
    ("mode", "chain", "words"),
    [
        ("blocking", ("blocking",), "cudaLaunchHostFunc"),
        ("spin", ("hostfunc_v2", "doorbell", "blocking"), "one warning per process"),
        ("auto", ("hostfunc_v2", "doorbell", "blocking"), "silently"),
    ],
)
def test_dispatch_chain(mode, chain, words):
    plan = plan_of(f"host_dispatch:\n  mode: {mode}\n")
    assert plan.dispatch_chain == chain
    reason = decision(plan, "host_dispatch").reason
    assert words in reason and "inline, in order, when CUDA is absent" in reason


def test_spin_with_on_unsupported_error_says_it_raises():
    plan = plan_of("host_dispatch:\n  mode: spin\n  on_unsupported: error\n")
    assert "gives an error" in decision(plan, "host_dispatch").reason


def test_the_lock_is_sorted_stable_json_that_round_trips():
    plan = plan_of("hooks:\n  decode_prologue: a:B\n", "examples/m.yaml")
    text = lock_json(plan)
    assert text == lock_json(plan_of("hooks:\n  decode_prologue: a:B\n", "examples/m.yaml"))
    data = json.loads(text)
    assert list(data) == sorted(data) and next(iter(data)) == "_generated"
    assert data["manifest"] == {"path": "examples/m.yaml", "sha256": plan.manifest_sha256}
    assert data["llm_kwargs"]["graph_batch_sizes"] == [1, 2, 4, 8, 16]
    assert data["hooks"] == plan.hooks_dict()


def test_a_manifest_path_that_would_break_a_header_line_is_refused():
    with pytest.raises(ManifestError, match="unprintable"):
        plan_of("", "examples/evil\n# injected.yaml")


def test_with_guided_decoding_the_loop_gate_stays_shut_and_says_why():
    plan = plan_of("guided_decoding:\n  backend: xgrammar\n")
    loop = decision(plan, "hooks.loop_on_execution_stream")
    assert loop.value == "off" and "side stream" in loop.reason
    assert decision(plan, "guided_decoding").reason.startswith("declared at line 6")


def _tp_manifest(tp: int, checkpoint: str = "random:llama-1b") -> str:
    return (
        f"schema_version: 1\nname: t\nmodel: {{checkpoint: '{checkpoint}'}}\n"
        f"runtime:\n  device: cuda\n  tensor_parallel_size: {tp}\n"
    )


def test_tensor_parallel_is_checked_against_the_head_counts():
    from fastpath.schema import ManifestError, parse_manifest

    plan = resolve(parse_manifest(_tp_manifest(2), "t.yaml"))
    (decision,) = [d for d in plan.decisions if "tensor_parallel" in str(d)]
    assert "head counts divide" in str(decision)
    with pytest.raises(
        ManifestError, match=r"t.yaml:6:25: error: tensor_parallel_size 3: num_attention_heads 32"
    ):
        resolve(parse_manifest(_tp_manifest(3), "t.yaml"))


def test_tensor_parallel_is_checked_for_a_catalog_model_without_its_weights():
    from fastpath.schema import ManifestError, parse_manifest

    plan = resolve(parse_manifest(_tp_manifest(3, "smollm2-135m-instruct"), "t.yaml"))
    assert "head counts divide" in str([d for d in plan.decisions if "tensor_parallel" in str(d)])
    with pytest.raises(
        ManifestError, match=r"tensor_parallel_size 4: num_attention_heads 9 is not divisible"
    ):
        resolve(parse_manifest(_tp_manifest(4, "smollm2-135m-instruct"), "t.yaml"))


def test_a_catalog_models_package_depends_on_the_conversion_extra():
    from fastpath.compiler import render
    from fastpath.schema import parse_manifest

    text = "schema_version: 1\nname: c\nmodel: {checkpoint: smollm2-135m-instruct}\n"
    pyproject = render(resolve(parse_manifest(text, "c.yaml")))["pyproject.toml"]
    assert 'dependencies = ["fastpath-llm[smollm]==' in pyproject
    plain = render(
        resolve(parse_manifest(text.replace("smollm2-135m-instruct", "random:tiny-llama"), "c.yaml"))
    )
    assert 'dependencies = ["fastpath-llm==' in plain["pyproject.toml"]


def test_tensor_parallel_on_an_unreadable_checkpoint_is_left_to_load_time():
    from fastpath.schema import parse_manifest

    plan = resolve(parse_manifest(_tp_manifest(3, "/no/such/checkpoint"), "t.yaml"))
    assert any("checked at load" in str(d) for d in plan.decisions)


def test_the_torch_free_split_table_matches_the_runtimes_presets():
    from fastpath.runtime.model.presets import PRESETS
    from fastpath.vocab import RANDOM_PRESET_SPLITS

    assert set(RANDOM_PRESET_SPLITS) == set(PRESETS)
    for name, cfg in PRESETS.items():
        assert RANDOM_PRESET_SPLITS[name] == (cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size), name


def test_tensor_parallel_reads_a_checkpoints_config_json(tmp_path):
    from fastpath.schema import ManifestError, parse_manifest

    (tmp_path / "config.json").write_text(
        json.dumps({"num_attention_heads": 12, "num_key_value_heads": 4, "intermediate_size": 96})
    )
    assert resolve(parse_manifest(_tp_manifest(4, str(tmp_path)), "t.yaml"))
    with pytest.raises(
        ManifestError, match="num_attention_heads 12 is not divisible by tensor_parallel_size 8"
    ):
        resolve(parse_manifest(_tp_manifest(8, str(tmp_path)), "t.yaml"))


def test_the_torch_free_positions_table_matches_the_runtimes_presets():
    from fastpath.runtime.model.presets import PRESETS
    from fastpath.vocab import RANDOM_PRESET_POSITIONS

    assert {name: cfg.max_position_embeddings for name, cfg in PRESETS.items()} == RANDOM_PRESET_POSITIONS


def test_a_max_seq_len_past_the_models_positions_is_refused_at_its_line(monkeypatch, tmp_path):
    from fastpath.vocab import ALLOW_LONG_ENV

    monkeypatch.delenv(ALLOW_LONG_ENV, raising=False)
    body = "runtime:\n  max_batch_size: 4\n  max_seq_len: 4096\n"
    with pytest.raises(ManifestError) as e:
        plan_of(body)
    assert str(e.value).startswith("m.yaml:7:16: error: max_seq_len 4096 is longer than the model's")
    assert "max_position_embeddings 2048 (random:tiny-llama)" in str(e.value) and ALLOW_LONG_ENV in str(
        e.value
    )
    assert plan_of(body.replace("4096", "2048")).max_seq_len == 2048
    monkeypatch.setenv(ALLOW_LONG_ENV, "1")
    assert plan_of(body).max_seq_len == 4096
    # A checkpoint folder's config.json is read; one that is not readable here is left to the engine.
    monkeypatch.delenv(ALLOW_LONG_ENV)
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}))
    folder = f"schema_version: 1\nname: m\nmodel:\n  checkpoint: {tmp_path}\nruntime:\n  max_seq_len: 2048\n"
    with pytest.raises(ManifestError, match="max_position_embeddings 1024"):
        resolve(parse_manifest(folder, "m.yaml"))
    (tmp_path / "config.json").write_text("{not json")
    assert resolve(parse_manifest(folder, "m.yaml")).max_seq_len == 2048
