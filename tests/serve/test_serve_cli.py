"""The command lines: `fastpath serve MODEL_OR_MANIFEST` and a package's `serve`, their defaults and overrides."""

import argparse

import pytest

import fastpath.runtime.serve.cli as runtime_cli
from fastpath.serve.cli import main, serve_main

MANIFEST = """\
schema_version: 1
name: cli-model
model: {checkpoint: "random:tiny-llama"}
serve: {port: 9123, served_model_name: acme/m, api_key_env: ACME_KEY, max_tokens: 64}
"""


def _args(argv):
    """The serve options alone, as runtime_cli.run takes them."""
    parser = argparse.ArgumentParser()
    runtime_cli.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(
        runtime_cli,
        "run",
        lambda factory, args, model_name=None, **_: seen.append((factory, args, model_name)) or 0,
    )
    return seen


def test_a_manifest_gives_the_defaults_and_flags_win(tmp_path, calls, monkeypatch):
    path = tmp_path / "m.yaml"
    path.write_text(MANIFEST)
    monkeypatch.setenv("ACME_KEY", "sesame")
    assert serve_main([str(path), "--max-tokens", "8", "--max-batch-size", "2"]) == 0
    ((_, args, name),) = calls
    config = runtime_cli.serve_config(args)
    assert name == "acme/m"
    assert (config.port, config.max_tokens, config.api_key) == (9123, 8, "sesame")
    assert runtime_cli.engine_kwargs(args) == {"max_batch_size": 2, "engine_process": True}


def test_a_model_is_served_under_its_own_name_with_flag_aliases(calls, monkeypatch):
    monkeypatch.delenv("FASTPATH_API_KEY", raising=False)
    assert (
        main(["serve", "random:tiny-llama", "--max-num-seqs", "3", "--max-model-len", "128", "--port", "0"])
        == 0
    )
    ((_, args, name),) = calls
    assert name == "random:tiny-llama"
    assert runtime_cli.engine_kwargs(args) == {
        "max_batch_size": 3,
        "max_seq_len": 128,
        "engine_process": True,
    }
    config = runtime_cli.serve_config(args)
    assert config.api_key is None and config.port == 0 and config.host == "127.0.0.1"


def test_the_engine_runs_in_the_servers_process_when_asked(calls):
    assert main(["serve", "random:tiny-llama", "--no-engine-process"]) == 0
    ((_, args, _),) = calls
    assert runtime_cli.engine_kwargs(args) == {"engine_process": False}


def test_a_bad_manifest_is_reported_with_its_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(MANIFEST.replace("port: 9123", "port: 99999"))
    assert serve_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml:4:" in err and err.startswith(str(path)), "the compiler's form, no second 'error:'"


def test_unknown_commands_and_bad_options(capsys):
    assert main(["compile"]) == 2
    assert "unknown command 'compile'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "random:tiny-llama", "--max-batch-size", "many"])


def test_a_package_serves_with_its_lock_as_defaults(calls):
    lock = {
        "name": "pkg-name",
        "serve": {
            "port": 9200,
            "served_model_name": "acme/p",
            "drain_timeout_s": 3.0,
            "stream_interval": 4,
            "api_server_count": 3,
        },
    }
    assert (
        runtime_cli.package_main(
            ["serve", "--host", "0.0.0.0"], prog="python -m pkg", llm_factory=dict, lock=lock
        )
        == 0
    )
    ((factory, args, name),) = calls
    config = runtime_cli.serve_config(args)
    assert factory is dict and name == "acme/p"
    assert (config.host, config.port, config.drain_timeout_s) == ("0.0.0.0", 9200, 3.0)
    assert (config.stream_interval, config.api_server_count) == (4, 3)
    with pytest.raises(SystemExit):
        runtime_cli.package_main([], prog="python -m pkg", llm_factory=dict, lock=lock)


def test_a_bad_serve_option_is_refused_before_the_engine_starts(capsys):
    args = _args(["--max-request-bytes", "5"])
    assert runtime_cli.run(lambda **kw: pytest.fail("the engine started"), args) == 2
    assert "max_request_bytes" in capsys.readouterr().err


WITHOUT_FASTAPI = """
import sys
sys.modules["fastapi"] = None  # as if the serve extra were not installed
from fastpath.serve.cli import main
try:
    main(["serve", "random:tiny-llama", "--help"])
except SystemExit as exit:
    print("help exit", exit.code, flush=True)
sys.exit(main(["serve", "random:tiny-llama"]))
"""


def test_without_the_serve_extra_the_command_says_what_to_install():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_FASTAPI], capture_output=True, text=True, timeout=120
    )
    assert "help exit 0" in done.stdout, done.stderr
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: the server needs fastapi, not installed: pip install 'fastpath-llm[serve]'"
    ), done.stderr


@pytest.mark.parametrize("flag", ["mixed-batches", "prefill-graphs"])
def test_an_engine_switch_is_the_engines_choice_unless_a_flag_says(calls, flag):
    assert main(["serve", "random:tiny-llama", f"--no-{flag}"]) == 0
    assert main(["serve", "random:tiny-llama", f"--{flag}"]) == 0
    assert main(["serve", "random:tiny-llama"]) == 0
    kwargs = [runtime_cli.engine_kwargs(args) for _, args, _ in calls]
    assert [k.get(flag.replace("-", "_")) for k in kwargs] == [False, True, None]


def test_request_templates_and_generation_config_are_vllms_flags(calls):
    assert main(["serve", "random:tiny-llama", "--generation-config", "vllm"]) == 0
    assert main(["serve", "random:tiny-llama", "--trust-request-chat-template"]) == 0
    (_, plain, _), (_, trusting, _) = calls
    assert runtime_cli.engine_kwargs(plain)["generation_config"] == "vllm"
    assert runtime_cli.serve_config(plain).trust_request_chat_template is False
    assert runtime_cli.serve_config(trusting).trust_request_chat_template is True


def test_allowed_origins_take_vllms_json_list_or_a_comma_list(calls, capsys):
    for given in ('["https://a.example", "*"]', "https://a.example, *"):
        assert main(["serve", "random:tiny-llama", "--allowed-origins", given]) == 0
    assert main(["serve", "random:tiny-llama"]) == 0
    origins = [runtime_cli.serve_config(args).allowed_origins for _, args, _ in calls]
    assert origins == [("https://a.example", "*"), ("https://a.example", "*"), ()]
    with pytest.raises(SystemExit):
        main(["serve", "random:tiny-llama", "--allowed-origins", '["a", 3]'])
    assert "--allowed-origins: a JSON list of strings" in capsys.readouterr().err


def test_a_vllm_serve_command_line_runs_with_its_neutral_flags(calls):
    argv = ["serve", "random:tiny-llama", "--trust-remote-code", "--disable-log-stats", "--disable-log-requests",
            "--no-enable-prefix-caching", "--kv-cache-dtype", "auto"]  # fmt: skip
    assert main(argv) == 0
    ((_, args, _),) = calls
    kwargs = runtime_cli.engine_kwargs(args)
    assert kwargs["trust_remote_code"] is True and kwargs["enable_prefix_caching"] is False
    assert kwargs["kv_cache_dtype"] == "auto" and kwargs["disable_log_stats"] is True
    assert runtime_cli.serve_config(args).access_log is False
    from fastpath.runtime.engine.options import parse_options

    parse_options(kwargs)  # what LLM() will be given: accepted


def test_served_model_name_takes_vllms_several_names_before_or_after_the_model(calls, capsys):
    assert main(["serve", "random:tiny-llama", "--served-model-name", "a", "b"]) == 0
    assert main(["serve", "random:tiny-llama", "--served-model-name", "a"]) == 0
    assert main(["serve", "--served-model-name", "a", "b", "random:tiny-llama", "--port", "9"]) == 0
    assert main(["serve", "--served-model-name", "a", "random:tiny-llama"]) == 0
    names = [runtime_cli.serve_config(args).served_model_name for _, args, _ in calls]
    assert names == [("a", "b"), "a", ("a", "b"), "a"]
    assert [args.target for _, args, _ in calls] == ["random:tiny-llama"] * 4
    with pytest.raises(SystemExit):
        main(["serve", "--served-model-name", "a"])
    assert "required: MODEL_OR_MANIFEST" in capsys.readouterr().err


def test_enable_prefix_caching_reaches_the_engine_and_is_off_unless_asked(calls):
    assert main(["serve", "random:tiny-llama", "--enable-prefix-caching"]) == 0
    assert main(["serve", "random:tiny-llama"]) == 0
    on, off = (runtime_cli.engine_kwargs(args) for _, args, _ in calls)
    assert on["enable_prefix_caching"] is True and "enable_prefix_caching" not in off


def test_auto_tool_choice_takes_vllms_two_flags(calls):
    assert (
        main(["serve", "random:tiny-llama", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]) == 0
    )
    assert main(["serve", "random:tiny-llama"]) == 0
    (_, on, _), (_, off, _) = calls
    assert runtime_cli.serve_config(on).auto_tool_parser == "hermes"
    assert runtime_cli.serve_config(off).auto_tool_parser is None


def test_auto_tool_choice_without_a_parser_is_refused_before_the_engine_starts(capsys):
    alone = _args(["--enable-auto-tool-choice"])
    assert runtime_cli.run(lambda **kw: pytest.fail("the engine started"), alone) == 2
    assert "enable_auto_tool_choice needs tool_call_parser" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _args(["--tool-call-parser", "mistral"])
    assert "invalid choice: 'mistral'" in capsys.readouterr().err


def test_reasoning_parser_is_vllms_flag(calls, capsys):
    assert main(["serve", "random:tiny-llama", "--reasoning-parser", "qwen3"]) == 0
    assert runtime_cli.serve_config(calls[0][1]).reasoning_parser == "qwen3"
    with pytest.raises(SystemExit):
        main(["serve", "random:tiny-llama", "--reasoning-parser", "r2"])
    assert "invalid choice: 'r2'" in capsys.readouterr().err


def test_a_lock_may_set_the_tool_and_reasoning_parsers_and_flags_still_win(calls):
    serve = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes", "reasoning_parser": "qwen3"}
    lock = {"name": "pkg", "serve": serve}
    for argv in (["serve"], ["serve", "--no-enable-auto-tool-choice", "--reasoning-parser", "deepseek_r1"]):
        assert runtime_cli.package_main(argv, prog="python -m pkg", llm_factory=dict, lock=lock) == 0
    declared, overridden = (runtime_cli.serve_config(args) for _, args, _ in calls)
    assert (declared.auto_tool_parser, declared.reasoning_parser) == ("hermes", "qwen3")
    assert (overridden.auto_tool_parser, overridden.reasoning_parser) == (None, "deepseek_r1")


def test_a_vllm_command_line_keeps_its_meaning(calls, monkeypatch, tmp_path):
    """What `vllm serve` lines carry: --model, -tp, several --api-key keys, --chat-template as a file,
    vLLM's engine flags at the values fastpath honours, and the docs switch."""
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    argv = ["serve", "--model", "random:tiny-llama", "-tp", "1", "--api-key", "k1", "k2",
            "--chat-template", str(template), "--swap-space", "4", "--max-logprobs", "20",
            "--enable-chunked-prefill", "-pp", "1", "--disable-fastapi-docs", "--return-tokens-as-token-ids",
            "--uvicorn-log-level", "warning"]  # fmt: skip
    assert main(argv) == 0
    ((_, args, name),) = calls
    config = runtime_cli.serve_config(args)
    assert name == "random:tiny-llama" and args.log_level == "warning"
    assert config.api_key == ("k1", "k2") and config.chat_template == template.read_text()
    assert (config.fastapi_docs, config.return_tokens_as_token_ids) == (False, True)
    engine = runtime_cli.engine_kwargs(args)
    assert {k: engine[k] for k in ("tensor_parallel_size", "swap_space", "max_logprobs", "pipeline_parallel_size")} == {
        "tensor_parallel_size": 1, "swap_space": 4.0, "max_logprobs": 20, "pipeline_parallel_size": 1}  # fmt: skip
    assert engine["enable_chunked_prefill"] is True


def test_a_key_set_for_vllm_never_leaves_the_server_open(calls, monkeypatch):
    monkeypatch.delenv("FASTPATH_API_KEY", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm")
    assert main(["serve", "random:tiny-llama"]) == 0
    assert runtime_cli.serve_config(calls[-1][1]).api_key == "from-vllm"
    monkeypatch.setenv("FASTPATH_API_KEY", "ours")
    assert main(["serve", "random:tiny-llama"]) == 0
    assert runtime_cli.serve_config(calls[-1][1]).api_key == "ours", "ours first"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--model", "a", "b"], "the model is given twice"),
        (["random:tiny-llama", "--enable-sleep-mode"], "--help lists the flags it takes, vLLM's among them"),
        (["random:tiny-llama", "--chat-template", "no/such/file.jinja"], "neither a file nor a template"),
    ],
)
def test_what_a_command_line_gets_wrong_is_a_usage_error(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        serve_main(argv)
    assert exit_.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--max-model-len", "-1"], "--max-seq-len / --max-model-len: max_seq_len must be"),
        (
            ["--gpu-memory-utilization", "2"],
            "--gpu-memory-utilization: gpu_memory_utilization must be in (0, 1]",
        ),
        (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype: LLM(kv_cache_dtype='fp8') is not supported"),
    ],
)
def test_a_value_the_engine_refuses_is_a_usage_error_naming_the_flag(flags, words, capsys):
    """Exit 2 and one line, not a traceback after the model loaded."""
    from fastpath.runtime import LLM

    args = _args([*flags, "--no-engine-process"])
    assert runtime_cli.run(lambda **kw: LLM("random:tiny-llama", device="cpu", **kw), args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err, err


def test_start_up_names_the_defaults_that_are_not_vllms(caplog):
    from types import SimpleNamespace

    llm = SimpleNamespace(config=SimpleNamespace(max_seq_len=4096, max_batch_size=16, enable_prefix_caching=False,
                                                 model=SimpleNamespace(max_position_embeddings=8192)))  # fmt: skip
    with caplog.at_level("INFO", logger="fastpath.serve"):
        runtime_cli._log_limits(llm, runtime_cli.ServeConfig())
    assert "max_model_len 4096 (the model's 8192; --max-model-len)" in caplog.text
    assert "prefix caching off" in caplog.text and "listening on 127.0.0.1" in caplog.text


def test_a_config_file_gives_defaults_and_the_command_line_wins(calls, tmp_path):
    """vLLM's --config: a YAML mapping keyed by flag names, either spelling; flags on the line win."""
    path = tmp_path / "serve.yaml"
    path.write_text(
        "model: random:tiny-llama\nmax_num_seqs: 4\nport: 9001\nenable-prefix-caching: true\n"
        "api-key: [k1, k2]\ndisable_fastapi_docs: true\nresponse-role: bot\n"
    )
    assert main(["serve", "--config", str(path), "--port", "9002"]) == 0
    ((_, args, name),) = calls
    config = runtime_cli.serve_config(args)
    assert name == "random:tiny-llama" and config.port == 9002, "the line's port wins"
    assert (config.api_key, config.fastapi_docs, config.response_role) == (("k1", "k2"), False, "bot")
    engine = runtime_cli.engine_kwargs(args)
    assert engine["max_batch_size"] == 4 and engine["enable_prefix_caching"] is True
    assert main(["serve", "random:tiny-llama", f"--config={path}"]) == 0, "a model on the line wins too"
    assert calls[-1][2] == "random:tiny-llama"


def test_a_config_file_wins_over_a_manifest_and_loses_to_a_flag(tmp_path, calls):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(MANIFEST)
    file = tmp_path / "c.yaml"
    file.write_text("max_tokens: 32\nport: 9300\n")
    assert serve_main([str(manifest), "--config", str(file), "--port", "9301"]) == 0
    config = runtime_cli.serve_config(calls[-1][1])
    assert (config.max_tokens, config.port, config.served_model_name) == (32, 9301, "acme/m")


def test_a_package_reads_a_config_file(tmp_path, calls):
    file = tmp_path / "c.yaml"
    file.write_text("stream_interval: 8\n")
    lock = {"name": "pkg-name", "serve": {"stream_interval": 2}}
    assert (
        runtime_cli.package_main(["serve", "--config", str(file)], prog="p", llm_factory=dict, lock=lock) == 0
    )
    assert runtime_cli.serve_config(calls[-1][1]).stream_interval == 8


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("max_num_seqs: [1, 2]\n", "max_num_seqs: takes one value, got a list"),
        ("host: {a: 1}\n", "host: takes one value, got a mapping"),
        ("allowed-origins: [1, 2]\n", "allowed-origins: a JSON list of strings"),
        ("allowed-origins: {a: b}\n", "allowed-origins: takes a list, got a mapping"),
        ("lora-modules: [[a, b]]\n", "lora-modules: takes a mapping, got a list"),
        ("lora-modules: [{name: a}]\n", 'lora-modules: a JSON object with string "name" and "path"'),
        ("max_num_seqs: many\n", "max_num_seqs: invalid int value: 'many'"),
        ("no_such_flag: 1\n", "'no_such_flag' is not an option here"),
        ("enable_prefix_caching: maybe\n", "enable_prefix_caching: must be true or false, got 'maybe'"),
        ("uvicorn_log_level: loud\n", "uvicorn_log_level: 'loud' is not one of"),
        ("- a list\n", "must be a mapping of option names to values, got list"),
        ("port: [\n", "not YAML"),
    ],
)
def test_what_a_config_file_gets_wrong_names_the_file_and_key(tmp_path, text, words, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        serve_main(["random:tiny-llama", "--config", str(path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--config {path}: " in err and words in err, err


def test_a_config_file_gives_json_taking_flags_yaml_lists_and_mappings(calls, tmp_path):
    """What vLLM's flags take as JSON text, a YAML file gives as YAML: a list of origins, adapters as
    mappings (or name=path strings)."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "allowed-origins: [https://a.example, https://b.example]\n"
        "lora-modules:\n  - {name: sql, path: /ad/sql}\n  - chat=/ad/chat\n  - {name: d, path: 2024-01-01}\n"
    )
    assert main(["serve", "random:tiny-llama", "--config", str(path)]) == 0
    config = runtime_cli.serve_config(calls[-1][1])
    assert config.allowed_origins == ("https://a.example", "https://b.example")
    assert config.lora_modules == (("sql", "/ad/sql"), ("chat", "/ad/chat"), ("d", "2024-01-01"))


def test_a_missing_config_file_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        serve_main(["random:tiny-llama", "--config", str(tmp_path / "none.yaml")])
    assert exit_.value.code == 2 and "No such file or directory" in capsys.readouterr().err


def test_block_size_is_vllms_flag(calls):
    assert main(["serve", "random:tiny-llama", "--block-size", "16"]) == 0
    assert runtime_cli.engine_kwargs(calls[-1][1])["block_size"] == 16


def test_a_block_size_other_than_fastpaths_is_refused_naming_the_flag(capsys):
    from fastpath.runtime import LLM

    args = _args(["--block-size", "32", "--no-engine-process"])
    assert runtime_cli.run(lambda **kw: LLM("random:tiny-llama", device="cpu", **kw), args) == 2
    assert "--block-size: LLM(block_size=32) is not supported" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--ssl-keyfile", "k.pem"], "--ssl-keyfile: serve option ssl_keyfile must be an existing file"),
        (
            ["--root-path", "api"],
            "--root-path: serve option root_path must be '' or a path that starts with '/'",
        ),
        (["--response-role", " "], "--response-role: serve option response_role must be a role name"),
        (
            ["--ssl-cert-reqs", "2"],
            "--ssl-cert-reqs: serve option ssl_cert_reqs needs ssl_keyfile and ssl_certfile",
        ),
        (["--drain-timeout", "99999"], "--drain-timeout: serve option drain_timeout_s must be"),
        (["--max-request-bytes", "5"], "--max-request-bytes: serve option max_request_bytes"),
        (["--disable-fastapi-docs", "--root-path", "x"], "--root-path: serve option root_path must be"),
    ],
)
def test_a_bad_tls_or_path_option_is_refused_before_the_engine_starts(flags, words, capsys):
    assert runtime_cli.run(lambda **kw: pytest.fail("the engine started"), _args(flags)) == 2
    assert words in capsys.readouterr().err


def test_a_config_files_no_spelling_turns_the_switch_off(calls, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("no-enable-prefix-caching: true\nno-engine-process: true\nno-access-log: true\n")
    assert main(["serve", "random:tiny-llama", "--config", str(path)]) == 0
    args = calls[-1][1]
    engine = runtime_cli.engine_kwargs(args)
    assert engine["enable_prefix_caching"] is False and engine["engine_process"] is False
    assert args.access_log is False
    path.write_text("no-enable-prefix-caching: false\n")
    assert main(["serve", "random:tiny-llama", "--config", str(path)]) == 0
    assert runtime_cli.engine_kwargs(calls[-1][1])["enable_prefix_caching"] is True


def test_an_abbreviated_config_flag_is_read_too(calls, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("max_num_seqs: 3\n")
    assert main(["serve", "random:tiny-llama", "--conf", str(path)]) == 0
    assert runtime_cli.engine_kwargs(calls[-1][1])["max_batch_size"] == 3


@pytest.mark.parametrize("text", ["api-key:\n", "host: null\n", "api-key: [k1, null]\n"])
def test_an_empty_value_in_a_config_file_is_refused(tmp_path, text, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        serve_main(["random:tiny-llama", "--config", str(path)])
    assert exit_.value.code == 2 and "needs a value" in capsys.readouterr().err


def test_a_missing_model_is_never_taken_from_keys_or_a_config_files_names(tmp_path, capsys):
    """Only the command line's --served-model-name may hold the model (vLLM's `--served-model-name a
    MODEL`); a key is never read as the model, nor printed."""
    with pytest.raises(SystemExit) as exit_:
        serve_main(["--api-key", "k1", "s3cr3t-key"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "required: MODEL_OR_MANIFEST" in err and "s3cr3t-key" not in err
    path = tmp_path / "c.yaml"
    path.write_text("served-model-name: [a, b]\n")
    with pytest.raises(SystemExit):
        serve_main(["--config", str(path)])
    assert "required: MODEL_OR_MANIFEST" in capsys.readouterr().err


def test_a_root_path_loses_its_trailing_slash_as_vllm_takes_it(calls):
    assert main(["serve", "random:tiny-llama", "--root-path", "/llm/"]) == 0
    assert runtime_cli.serve_config(calls[-1][1]).root_path == "/llm"
    with pytest.raises(ValueError, match="does not end with one"):
        runtime_cli.ServeConfig(root_path="/llm/")


def test_what_the_app_asks_of_the_engine_is_checked_before_serving(capsys):
    """LoRA modules on an engine without LoRA: one line and exit 2, not a traceback from the app."""
    from fastpath.runtime import LLM

    args = _args(["--lora-modules", "a=/tmp", "--no-engine-process"])
    assert runtime_cli.run(lambda **kw: LLM("random:tiny-llama", device="cpu", **kw), args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --lora-modules: lora_modules need an engine with LoRA on"), err


PACKAGE_WITHOUT_FASTAPI = """
import sys
sys.modules["fastapi"] = None  # as if the serve extra were not installed
from fastpath.runtime.serve.cli import package_main
lock = {"name": "my-model", "distribution": "fastpath-gen-my-model"}
sys.exit(package_main(["serve"], prog="my_model", llm_factory=dict, lock=lock))
"""


def test_a_package_without_the_serve_extra_names_its_own_extra():
    """The generated package's [serve] extra pins the fastpath it was built with, so that is the line."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", PACKAGE_WITHOUT_FASTAPI], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: the server needs fastapi, not installed: pip install 'fastpath-gen-my-model[serve]'"
    ), done.stderr
