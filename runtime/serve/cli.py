"""Command-line options shared by `fastpath serve` and every generated package's `python -m <pkg> serve`.

`run(llm_factory, args)` builds the engine from the engine options the command line gave (the rest
keep the factory's defaults: a manifest's, for a package), serves it, and closes it after the drain.
A manifest's `serve:` section arrives as parser defaults, so a flag still overrides it.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastpath.vocab import REASONING_PARSERS, TOOL_CALL_PARSERS, install_line

from .config import DEFAULT_PORT, ServeConfig
from .config_file import FLAG, apply_config_file, takes_json

DEFAULT_API_KEY_ENV = "FASTPATH_API_KEY"
VLLM_API_KEY_ENV = "VLLM_API_KEY"

# flag -> (LLM keyword, type, help); only flags given on the command line reach the factory.
ENGINE_FLAGS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "--device": ("device", str, "auto | cuda | cpu"),
    "--dtype": ("dtype", str, "auto | float32 | bfloat16 | float16 (vLLM's half and float too)"),
    "--seed": ("seed", int, "engine seed (random weights, unseeded requests)"),
    "--max-batch-size": ("max_batch_size", int, "most sequences in one step (vLLM: --max-num-seqs)"),
    "--max-seq-len": ("max_seq_len", int, "longest sequence, prompt and output (vLLM: --max-model-len)"),
    "--max-num-batched-tokens": ("max_num_batched_tokens", int, "most prompt tokens one prefill step takes"),
    "--kv-cache-blocks": ("kv_cache_blocks", int, "KV-cache blocks (default: from free memory)"),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float, "share of GPU memory the engine may use"),
    "--guided-backend": ("guided_backend", str, "auto | xgrammar | llguidance | none"),
    "--generation-config": (
        "generation_config",
        str,
        "auto | vllm | a folder: sampling defaults for what requests leave unset (auto: the model's)",
    ),
    "--tensor-parallel-size": ("tensor_parallel_size", int, "GPUs that split each layer"),
    "--tokenizer": ("tokenizer", str, "a tokenizer folder, when the model's has none"),
    "--max-loras": ("max_loras", int, "LoRA adapters that can run in one batch (with --enable-lora)"),
    "--max-lora-rank": ("max_lora_rank", int, "the largest adapter rank accepted (with --enable-lora)"),
}
ALIASES = {
    "--max-num-seqs": "--max-batch-size",
    "--max-model-len": "--max-seq-len",
    "--tp": "--tensor-parallel-size",
    "-tp": "--tensor-parallel-size",  # vLLM's short form
}
# vLLM's engine flags for settings fastpath has none of -> (LLM keyword, type): the engine accepts the
# values that ask for what it does anyway and refuses any other, saying what it does instead
# (engine/vllm_keywords.py). A bool type is a switch.
VLLM_ENGINE_FLAGS: dict[str, tuple[str, Callable[[str], Any] | type[bool]]] = {
    "--revision": ("revision", str),
    "--tokenizer-revision": ("tokenizer_revision", str),
    "--download-dir": ("download_dir", str),
    "--tokenizer-mode": ("tokenizer_mode", str),
    "--kv-cache-dtype": ("kv_cache_dtype", str),
    "--quantization": ("quantization", str),
    "--pipeline-parallel-size": ("pipeline_parallel_size", int),
    "--distributed-executor-backend": ("distributed_executor_backend", str),
    "--swap-space": ("swap_space", float),
    "--cpu-offload-gb": ("cpu_offload_gb", float),
    "--max-seq-len-to-capture": ("max_seq_len_to_capture", int),
    "--max-logprobs": ("max_logprobs", int),
    "--task": ("task", str),
    "--runner": ("runner", str),
    "--convert": ("convert", str),
    "--trust-remote-code": ("trust_remote_code", bool),
    "--disable-log-stats": ("disable_log_stats", bool),
    "--disable-custom-all-reduce": ("disable_custom_all_reduce", bool),
    "--enable-chunked-prefill": ("enable_chunked_prefill", bool),
    "--block-size": ("block_size", int),
}
VLLM_SHORT = {"--quantization": "-q", "--pipeline-parallel-size": "-pp"}

SERVE_DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1",
    "port": DEFAULT_PORT,
    "served_model_name": None,
    "api_key_env": DEFAULT_API_KEY_ENV,
    "max_queued_requests": 1024,
    "max_tokens": None,
    "max_request_bytes": 8 << 20,
    "drain_timeout_s": 30.0,
    "stream_interval": 1,
    "api_server_count": 1,
    "enable_auto_tool_choice": False,
    "tool_call_parser": None,
    "reasoning_parser": None,
    "root_path": "",
    "response_role": "assistant",
}


def add_arguments(parser: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None) -> None:
    """The server's and the engine's options; `defaults` (a manifest's serve section) replace ours."""
    d = {**SERVE_DEFAULTS, **{k: v for k, v in (defaults or {}).items() if v is not None}}
    s = parser.add_argument_group("server")
    s.add_argument("--host", default=d["host"], help="address to listen on (default: %(default)s)")
    s.add_argument("--port", type=int, default=d["port"], help="port (default: %(default)s)")
    s.add_argument(
        "--served-model-name",
        nargs="+",
        default=d["served_model_name"],
        help="the names requests may use, as vLLM's (responses carry the first; default: the model)",
    )
    s.add_argument(
        "--api-key",
        nargs="+",
        default=None,
        help="require `Authorization: Bearer KEY` (any one of several) on /v1, /tokenize, /detokenize "
        "and /version",
    )
    s.add_argument(
        "--api-key-env",
        default=d["api_key_env"],
        help=f"environment variable read when --api-key is absent; unset, vLLM's {VLLM_API_KEY_ENV} is read",
    )
    s.add_argument(
        "--chat-template",
        type=_chat_template,
        default=None,
        help="a chat template (a file, or the template's text) used instead of the tokenizer's (vLLM's flag)",
    )
    s.add_argument(
        "--return-tokens-as-token-ids",
        action="store_true",
        help="logprobs spell each token 'token_id:<id>' unless a request says otherwise (vLLM's flag)",
    )
    s.add_argument(
        "--disable-fastapi-docs", action="store_true", help="no /docs, /redoc or /openapi.json (vLLM's flag)"
    )
    s.add_argument(
        FLAG,
        metavar="FILE",
        help="a YAML file of these options (keys: flag names without the dashes); a flag given on the "
        "command line wins over it (vLLM's flag)",
    )
    s.add_argument(
        "--root-path",
        default=d["root_path"],
        help="the path prefix a proxy serves this server under (ASGI root_path; vLLM's flag)",
    )
    s.add_argument("--ssl-keyfile", default=None, help="serve HTTPS with this private key (PEM)")
    s.add_argument("--ssl-certfile", default=None, help="and this certificate chain (PEM)")
    s.add_argument(
        "--ssl-ca-certs", default=None, help="CA certificates clients' certificates are checked against"
    )
    s.add_argument(
        "--ssl-cert-reqs",
        type=int,
        default=0,
        choices=[0, 1, 2],
        help="client certificates: 0 not asked for, 1 optional, 2 required (Python's ssl.CERT_*; default: 0)",
    )
    s.add_argument(
        "--response-role",
        default=d["response_role"],
        help="the role chat replies carry when the request adds a generation prompt (default: %(default)s)",
    )
    s.add_argument(
        "--max-queued-requests",
        type=int,
        default=d["max_queued_requests"],
        help="beyond a full batch; more get 503",
    )
    s.add_argument(
        "--max-tokens", type=int, default=d["max_tokens"], help="the most tokens a request may ask for"
    )
    s.add_argument(
        "--max-request-bytes", type=int, default=d["max_request_bytes"], help="larger bodies get 413"
    )
    s.add_argument(
        "--drain-timeout", dest="drain_timeout_s", type=float, default=d["drain_timeout_s"], help="seconds"
    )
    s.add_argument(
        "--stream-interval",
        type=int,
        default=d["stream_interval"],
        help="tokens a streamed event gathers before it is sent (the first token and the end go at once); "
        "more: less server CPU per token at high concurrency (default: %(default)s)",
    )
    s.add_argument(
        "--api-server-count",
        type=int,
        default=d["api_server_count"],
        help="processes serving HTTP in front of the one engine process, for more streamed tokens a "
        "second than one Python process can send (default: %(default)s)",
    )
    s.add_argument("--no-access-log", dest="access_log", action="store_false", help="no per-request log line")
    s.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="let requests bring their own chat_template (vLLM's flag; a template runs on the server's CPU)",
    )
    s.add_argument(
        "--allowed-origins",
        type=_origins,
        default=(),
        help="web origins whose pages may call the server from a browser (CORS), comma-separated or a "
        "JSON list as vLLM takes it; '*' for any (default: none)",
    )
    s.add_argument(
        "--lora-modules",
        nargs="+",
        type=_lora_module,
        default=(),
        help="LoRA adapters requests may name as their model: name=path, or vLLM's JSON "
        '\'{"name": ..., "path": ...}\' (needs --enable-lora)',
    )
    s.add_argument(
        "--enable-auto-tool-choice",
        action=argparse.BooleanOptionalAction,
        default=d["enable_auto_tool_choice"],
        help="chat requests with tools may leave the choice to the model (tool_choice 'auto'), whose "
        "calls are read out of its text with --tool-call-parser (vLLM's flag)",
    )
    s.add_argument(
        "--tool-call-parser",
        choices=TOOL_CALL_PARSERS,
        default=d["tool_call_parser"],
        help="the format the model writes tool calls in: hermes (Hermes, Qwen2.5/3), llama3_json "
        "(Llama 3.1/3.2's JSON template) or pythonic (Llama 3.2's and Llama 4's pythonic templates; llama4_pythonic is the same)",
    )
    s.add_argument(
        "--reasoning-parser",
        choices=REASONING_PARSERS,
        default=d["reasoning_parser"],
        help="send a reasoning model's thinking as `reasoning`, apart from its content: deepseek_r1 "
        "(DeepSeek R1, QwQ, templates that open <think> in the prompt) or qwen3 (vLLM's flag)",
    )
    s.add_argument(
        "--log-level",
        "--uvicorn-log-level",  # vLLM's name for the HTTP server's level: here one level for both
        default="info",
        choices=["trace", "debug", "info", "warning", "error", "critical"],
    )
    e = parser.add_argument_group("engine")
    for flag, (key, kind, text) in ENGINE_FLAGS.items():
        names = [flag, *(a for a, target in ALIASES.items() if target == flag)]
        e.add_argument(*names, dest=f"engine_{key}", type=kind, default=None, help=text)
    e.add_argument(
        "--enforce-eager", dest="engine_enforce_eager", action="store_const", const=True, default=None
    )
    e.add_argument(
        "--mixed-batches",
        dest="engine_mixed_batches",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode running requests in the same step as a prefill (default: on when the prefill "
        "attention is one launch and --max-num-batched-tokens >= --max-batch-size)",
    )
    e.add_argument(
        "--prefill-graphs",
        dest="engine_prefill_graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay prefill steps from CUDA graphs captured at a few token counts (default: on with "
        "CUDA graphs, one rank and a one-launch prefill attention)",
    )
    e.add_argument(
        "--enable-lora",
        dest="engine_enable_lora",
        action="store_const",
        const=True,
        default=None,
        help="serve LoRA adapters (PEFT folders) named by --lora-modules (vLLM's flag)",
    )
    e.add_argument(
        "--enable-prefix-caching",
        dest="engine_enable_prefix_caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep whole KV blocks findable by their tokens, so a prompt that starts like an earlier "
        "one prefills only the rest (vLLM's flag; default: off)",
    )
    # vLLM's flags for settings fastpath has none of: accepted where they ask for what it does
    # (engine/vllm_keywords.py), so a `vllm serve` command line runs here too.
    v = parser.add_argument_group("vLLM's flags, accepted where they ask for what fastpath does")
    for flag, (key, kind) in VLLM_ENGINE_FLAGS.items():
        names = [flag, *([VLLM_SHORT[flag]] if flag in VLLM_SHORT else [])]
        if kind is bool:
            v.add_argument(*names, dest=f"engine_{key}", action="store_const", const=True)
        else:
            v.add_argument(*names, dest=f"engine_{key}", type=kind)
    v.add_argument(
        "--disable-log-requests", dest="access_log", action="store_false", help="as --no-access-log"
    )
    v.add_argument(
        "--enable-log-requests", dest="access_log", action="store_true", help="the access log (on by default)"
    )
    e.add_argument(
        "--engine-process",
        dest="engine_engine_process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the engine in a process of its own, so the server's Python never holds its GIL "
        "(default: on; --no-engine-process runs it in the server's process)",
    )


def serve_config(args: argparse.Namespace) -> ServeConfig:
    return ServeConfig(
        host=args.host,
        port=args.port,
        served_model_name=_names(args.served_model_name),
        api_key=_api_key(args),
        max_queued_requests=args.max_queued_requests,
        max_tokens=args.max_tokens,
        max_request_bytes=args.max_request_bytes,
        drain_timeout_s=args.drain_timeout_s,
        access_log=args.access_log,
        stream_interval=args.stream_interval,
        api_server_count=args.api_server_count,
        trust_request_chat_template=args.trust_request_chat_template,
        allowed_origins=args.allowed_origins,
        lora_modules=tuple(args.lora_modules or ()),
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        chat_template=args.chat_template,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        fastapi_docs=not args.disable_fastapi_docs,
        root_path=args.root_path.rstrip("/") if args.root_path else args.root_path,  # vLLM takes "/api/"
        ssl_keyfile=args.ssl_keyfile,
        ssl_certfile=args.ssl_certfile,
        ssl_ca_certs=args.ssl_ca_certs,
        ssl_cert_reqs=args.ssl_cert_reqs,
        response_role=args.response_role,
    )


def _api_key(args: argparse.Namespace) -> str | tuple[str, ...] | None:
    """--api-key's keys; else the variable --api-key-env names; else vLLM's VLLM_API_KEY, so a key set
    for a vLLM deployment never leaves this server open."""
    if args.api_key is not None:
        return args.api_key[0] if len(args.api_key) == 1 else tuple(args.api_key)
    return os.environ.get(args.api_key_env) or os.environ.get(VLLM_API_KEY_ENV) or None


def _chat_template(text: str) -> str:
    """--chat-template: a file's text, else the template itself (as vLLM takes it)."""
    if os.path.isfile(text):
        with open(text, encoding="utf-8") as f:
            return f.read()
    if "{{" in text or "{%" in text:
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is neither a file nor a template")


def _names(given: str | list[str] | None) -> str | tuple[str, ...] | None:
    """--served-model-name's one name as a str (as a manifest gives it), several as a tuple."""
    if given is None or isinstance(given, str):
        return given
    return given[0] if len(given) == 1 else tuple(given)


@takes_json(list)
def _origins(text: str) -> tuple[str, ...]:
    """'a,b' or vLLM's '["a", "b"]' -> ('a', 'b')."""
    if text.lstrip().startswith("["):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not a JSON list: {exc}") from None
        if not isinstance(value, list) or not all(isinstance(o, str) for o in value):
            raise argparse.ArgumentTypeError("a JSON list of strings")
        return tuple(o.strip() for o in value)
    return tuple(o.strip() for o in text.split(",") if o.strip())


@takes_json(dict)
def _lora_module(text: str) -> tuple[str, str]:
    """'name=path' or vLLM's '{"name": ..., "path": ...}' -> (name, path)."""
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not a JSON object: {exc}") from None
        if not isinstance(value, dict) or not all(isinstance(value.get(k), str) for k in ("name", "path")):
            raise argparse.ArgumentTypeError('a JSON object with string "name" and "path"')
        return value["name"], value["path"]
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not name=path")
    return name, path


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        key.removeprefix("engine_"): value
        for key, value in vars(args).items()
        if key.startswith("engine_") and value is not None
    }


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=logging.DEBUG if level == "trace" else getattr(logging, level.upper()),  # trace: uvicorn's
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


# What the `serve` extra installs and the server imports.
SERVER_MODULES = ("fastapi", "uvicorn", "prometheus_client")


def missing_server_modules() -> list[str]:
    def installed(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # ValueError: blocked in sys.modules
            return False

    return [m for m in SERVER_MODULES if not installed(m)]


def run(
    llm_factory: Callable[..., Any],
    args: argparse.Namespace,
    *,
    model_name: str | None = None,
    distribution: str | None = None,
) -> int:
    """Build the engine, serve until SIGTERM, drain, close the engine; 0, 1 when the engine (or an API
    server) died first, or 2 for a bad option."""
    missing = missing_server_modules()
    if missing:
        print(
            f"error: the server needs {', '.join(missing)}, not installed: "
            + (f"pip install '{distribution}[serve]'" if distribution else install_line("serve")),
            file=sys.stderr,
        )
        return 2
    from .api_servers import serve_many
    from .app import check_serving
    from .server import serve

    configure_logging(args.log_level)
    try:
        config = serve_config(args)
    except ValueError as exc:
        print(f"error: {_in_serve_flags(str(exc))}", file=sys.stderr)
        return 2
    if config.api_server_count > 1 and args.engine_engine_process is False:
        print(
            "error: --api-server-count above 1 needs the engine process; drop --no-engine-process",
            file=sys.stderr,
        )
        return 2
    given = engine_kwargs(args)
    try:
        llm = llm_factory(**given)
    except (ValueError, TypeError, OSError) as exc:  # a flag's value the engine refused, a missing folder
        print(f"error: {_in_flags(str(exc), given)}", file=sys.stderr)
        return 2
    _log_limits(llm, config)
    try:
        try:  # what the app asks of this engine, before any API server starts (one line, exit 2)
            check_serving(llm, config, model_name)
        except ValueError as exc:
            print(f"error: {_in_serve_flags(str(exc))}", file=sys.stderr)
            return 2
        try:
            if config.api_server_count == 1:
                return 0 if serve(llm, config, model_name=model_name, log_level=args.log_level) else 1
            return serve_many(llm, config, model_name=model_name, log_level=args.log_level)
        except OSError as exc:  # the address is taken, or not ours to bind
            print(f"error: {exc}", file=sys.stderr)
            return 2
    finally:
        llm.close()


def _log_limits(llm: Any, config: ServeConfig) -> None:
    """The settings whose defaults are not vLLM's, once at start-up, so a `vllm serve` user sees them."""
    c = llm.config
    model_len = getattr(c.model, "max_position_embeddings", c.max_seq_len)
    logging.getLogger("fastpath.serve").info(
        "max_model_len %d (the model's %d; --max-model-len), max_num_seqs %d (--max-num-seqs), prefix "
        "caching %s (--enable-prefix-caching), listening on %s (vLLM's default is every interface: "
        "--host 0.0.0.0)",
        c.max_seq_len,
        model_len,
        c.max_batch_size,
        "on" if getattr(c, "enable_prefix_caching", False) else "off",
        config.host,
    )


def _in_serve_flags(message: str) -> str:
    """A ServeConfig error in the command line's words: "serve option root_path ..." as "--root-path: ..."."""
    found = re.match(r"(?:serve options? )?(\w+)\b", message)
    flag = _serve_flags().get(found.group(1)) if found else None
    return f"{flag}: {message}" if flag else message


@functools.cache
def _serve_flags() -> dict[str, str]:
    """ServeConfig field -> the flag that sets it (the first long spelling of the option of that dest)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    flags = {}
    for action in parser._actions:  # argparse keeps no public list of its options
        long = [o for o in action.option_strings if o.startswith("--")]
        if long and action.dest in ServeConfig.__dataclass_fields__:
            flags.setdefault(action.dest, long[0])
    flags["fastapi_docs"] = "--disable-fastapi-docs"
    return flags


def _in_flags(message: str, given: Mapping[str, Any]) -> str:
    """An engine error in the command line's words: the flag that gave the keyword it names."""
    flags = {key: flag for flag, (key, _, _) in ENGINE_FLAGS.items()}
    flags |= {key: flag for flag, (key, _) in VLLM_ENGINE_FLAGS.items()}
    for key in sorted(given, key=len, reverse=True):  # max_seq_len before seq_len-like prefixes
        if key in message and key in flags:
            spelled = [flags[key], *(a for a, target in ALIASES.items() if target == flags[key])]
            return f"{' / '.join(spelled)}: {message}"
    return message


class ServeArgumentParser(argparse.ArgumentParser):
    """argparse, whose "unrecognized arguments" says where the flags a vLLM command line may carry
    are listed (those fastpath takes, and what it does instead of the rest)."""

    def error(self, message: str) -> Any:
        if message.startswith("unrecognized arguments"):
            message += (
                f" ({self.prog} --help lists the flags it takes, vLLM's among them; a vLLM flag not "
                "listed there has no counterpart here)"
            )
        super().error(message)


def package_main(
    argv: Sequence[str] | None, *, prog: str, llm_factory: Callable[..., Any], lock: Mapping[str, Any]
) -> int:
    """`python -m <package> serve [...]`: a generated package serves its compiled executor.
    `lock` is the package's MANIFEST: its serve section gives the defaults, its name the model's."""
    serve_section = dict(lock.get("serve") or {})
    parser = ServeArgumentParser(
        prog=prog, description=f"{lock['name']}: fastpath's engine as compiled from its manifest"
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ServeArgumentParser)
    add_arguments(
        serve := commands.add_parser(
            "serve", help="an OpenAI-compatible HTTP server for this package's engine"
        ),
        serve_section,
    )
    apply_config_file(serve, list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    return run(
        llm_factory,
        args,
        model_name=serve_section.get("served_model_name") or lock["name"],
        distribution=lock.get("distribution"),  # its [serve] extra pins the fastpath it was built with
    )
