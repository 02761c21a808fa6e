"""ServeConfig: how the server listens and what it admits; every value checked where it enters."""

from __future__ import annotations

import math
import os
import ssl
from dataclasses import dataclass, field

from fastpath.vocab import REASONING_PARSERS, TOOL_CALL_PARSERS

from .errors import RequestInvalid, Unavailable

DEFAULT_PORT = 8000


def runtime_lora_updating_from_env() -> bool:
    """vLLM's switch for its adapter routes: VLLM_ALLOW_RUNTIME_LORA_UPDATING true or 1."""
    return os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").strip().lower() in ("1", "true")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """- `served_model_name`: the name /v1/models lists and requests must use (None: the model as given);
      several (a tuple) are aliases, as vLLM's `--served-model-name a b`, and responses carry the first.
    - `api_key`: when set, /v1/* needs `Authorization: Bearer <api_key>`; a tuple: any one of them
      (vLLM's `--api-key k1 k2`).
    - `chat_template`: the template chats are rendered with, replacing the tokenizer's (vLLM's
      --chat-template); a request's own still needs `trust_request_chat_template`.
    - `return_tokens_as_token_ids`: every request's logprobs spell tokens "token_id:<id>" (vLLM's flag).
    - `fastapi_docs`: /docs, /redoc and /openapi.json are served (vLLM's --disable-fastapi-docs: off).
    - `max_queued_requests`: completions that may wait beyond a full batch; more get 503.
    - `max_tokens`: the most a request may ask for, and the default when it asks for none.
    - `max_request_bytes`: a larger body gets 413.
    - `drain_timeout_s`: after SIGTERM, how long running requests may finish before they are cut.
    - `stream_interval`: a stream's events carry at least this many tokens (its first token and its
      end go at once): fewer, larger events cost the server less CPU per token under load.
    - `api_server_count`: processes that serve HTTP in front of the one engine process (vLLM's
      --api-server-count); above one, the admission bounds are shared out among them.
    - `trust_request_chat_template`: requests may bring their own `chat_template`. Off by default,
      as in vLLM: a template is a program that runs on the server's CPU for as long as it likes.
    - `allowed_origins`: web origins whose pages may call the server from a browser (CORS; "*" for
      any). None by default, unlike vLLM's "*": any page a user opens could otherwise drive a server
      on their machine.
    - `lora_modules`: (name, PEFT folder) pairs, vLLM's --lora-modules: a request whose `model` is
      the name runs with that adapter (the engine needs enable_lora).
    - `runtime_lora_updating`: vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter add and
      remove adapter names while the server runs. Off unless VLLM_ALLOW_RUNTIME_LORA_UPDATING is
      true or 1, as in vLLM: any client with the API key could then make the server read a folder
      of its choosing. One API server process only (each holds its own names).
    - `enable_auto_tool_choice`, `tool_call_parser`: vLLM's --enable-auto-tool-choice and
      --tool-call-parser: chat requests with tools and tool_choice "auto" (or none given) read the
      model's calls out of its text in the parser's format (serve/tool_calls.py). A named tool and
      "required" need neither: guided decoding holds them to the tools' schemas.
    - `reasoning_parser`: vLLM's --reasoning-parser: a chat reply's thinking goes out as `reasoning`
      (and `reasoning_content`), apart from its content (serve/reasoning.py).
    - `root_path`: the path prefix a proxy serves the server under (ASGI root_path, vLLM's --root-path).
    - `ssl_keyfile`, `ssl_certfile`: serve HTTPS with this key and certificate chain (PEM); both or
      neither, and they must load together. `ssl_ca_certs`, `ssl_cert_reqs` (0, 1 or 2, Python's
      ssl.CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED): the clients' certificates.
    - `response_role`: the role chat replies carry when the request adds a generation prompt (vLLM's
      --response-role); without one, a reply continues the last message and carries its role.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    served_model_name: str | tuple[str, ...] | None = None
    api_key: str | tuple[str, ...] | None = None
    max_queued_requests: int = 1024
    max_tokens: int | None = None
    max_request_bytes: int = 8 << 20
    drain_timeout_s: float = 30.0
    access_log: bool = True
    stream_interval: int = 1
    api_server_count: int = 1
    trust_request_chat_template: bool = False
    allowed_origins: tuple[str, ...] = ()
    lora_modules: tuple[tuple[str, str], ...] = ()
    runtime_lora_updating: bool = field(default_factory=runtime_lora_updating_from_env)
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None
    return_tokens_as_token_ids: bool = False
    fastapi_docs: bool = True
    root_path: str = ""
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0
    response_role: str = "assistant"

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_certfile else "http"

    @property
    def auto_tool_parser(self) -> str | None:
        """The parser "auto" tool choice reads calls with; None: "auto" is refused."""
        return self.tool_call_parser if self.enable_auto_tool_choice else None

    def __post_init__(self) -> None:
        _check(isinstance(self.enable_auto_tool_choice, bool), "enable_auto_tool_choice", "True or False",
               self.enable_auto_tool_choice)  # fmt: skip
        _check(self.tool_call_parser is None or self.tool_call_parser in TOOL_CALL_PARSERS, "tool_call_parser",
               f"None or one of {', '.join(TOOL_CALL_PARSERS)}", self.tool_call_parser)  # fmt: skip
        _check(self.reasoning_parser is None or self.reasoning_parser in REASONING_PARSERS, "reasoning_parser",
               f"None or one of {', '.join(REASONING_PARSERS)}", self.reasoning_parser)  # fmt: skip
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError(
                "serve option enable_auto_tool_choice needs tool_call_parser (--tool-call-parser "
                f"{'|'.join(TOOL_CALL_PARSERS)}): the format the model writes its calls in"
            )
        mods = self.lora_modules
        _check(
            isinstance(mods, tuple)
            and all(
                isinstance(m, tuple)
                and len(m) == 2
                and all(isinstance(v, str) and v and v.isprintable() for v in m)
                for m in mods
            )
            and len({m[0] for m in mods}) == len(mods),
            "lora_modules",
            "a tuple of (name, adapter folder) pairs with distinct names",
            mods,
        )
        _check(
            isinstance(self.runtime_lora_updating, bool),
            "runtime_lora_updating",
            "True or False",
            self.runtime_lora_updating,
        )
        if self.runtime_lora_updating and self.api_server_count > 1:
            raise ValueError(
                "runtime_lora_updating (VLLM_ALLOW_RUNTIME_LORA_UPDATING) needs one API server process: "
                f"each of the {self.api_server_count} would hold its own adapter names"
            )
        origins = self.allowed_origins
        _check(
            isinstance(origins, tuple)
            and all(isinstance(o, str) and o.isprintable() and o.strip() == o != "" for o in origins),
            "allowed_origins",
            "a tuple of origins such as 'https://example.com', or '*'",
            origins,
        )
        _check(
            isinstance(self.host, str) and self.host.strip() == self.host != "",
            "host",
            "a host name",
            self.host,
        )
        _check(_int(self.port) and 0 <= self.port <= 65535, "port", "an int in [0, 65535]", self.port)
        if self.served_model_name is not None:
            names = self.served_model_name
            names = (names,) if isinstance(names, str) else names
            ok = isinstance(names, tuple) and len(names) >= 1 and len(set(names)) == len(names)
            _check(
                ok and all(isinstance(n, str) and n.isprintable() and n != "" for n in names),
                "served_model_name",
                "a printable name, or a tuple of distinct ones (the first is the one responses carry)",
                self.served_model_name,
            )
        if self.api_key is not None:
            keys = (self.api_key,) if isinstance(self.api_key, str) else self.api_key
            _check(
                isinstance(keys, tuple) and bool(keys) and all(isinstance(k, str) and k != "" for k in keys),
                "api_key",
                "a non-empty string, or a tuple of them",
                "<hidden>",
            )
        if self.chat_template is not None:
            _check(isinstance(self.chat_template, str) and self.chat_template.strip() != "",
                   "chat_template", "a template's text", "<template>")  # fmt: skip
        _check(
            _int(self.max_queued_requests) and self.max_queued_requests >= 0,
            "max_queued_requests",
            "an int >= 0",
            self.max_queued_requests,
        )
        if self.max_tokens is not None:
            _check(
                _int(self.max_tokens) and self.max_tokens >= 1,
                "max_tokens",
                "None or an int >= 1",
                self.max_tokens,
            )
        _check(
            _int(self.max_request_bytes) and self.max_request_bytes >= 1024,
            "max_request_bytes",
            "an int >= 1024",
            self.max_request_bytes,
        )
        _check(
            _int(self.stream_interval) and 1 <= self.stream_interval <= 64,
            "stream_interval",
            "an int in [1, 64]",
            self.stream_interval,
        )
        _check(
            _int(self.api_server_count) and 1 <= self.api_server_count <= 64,
            "api_server_count",
            "an int in [1, 64]",
            self.api_server_count,
        )
        _check(isinstance(self.root_path, str) and (self.root_path == "" or self.root_path.startswith("/"))
               and not self.root_path.endswith("/") and self.root_path.isprintable(), "root_path",
               "'' or a path that starts with '/' and does not end with one", self.root_path)  # fmt: skip
        _check(isinstance(self.response_role, str) and self.response_role.strip() == self.response_role != ""
               and self.response_role.isprintable(), "response_role", "a role name such as 'assistant'",
               self.response_role)  # fmt: skip
        _check_tls(self)
        t = self.drain_timeout_s
        ok = isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and 0 <= t <= 3600
        _check(ok, "drain_timeout_s", "seconds in [0, 3600]", t)


def _check_tls(config: ServeConfig) -> None:
    """The key and certificate load together here, so a bad pair is an error before the engine loads."""
    _check(_int(config.ssl_cert_reqs) and config.ssl_cert_reqs in (0, 1, 2), "ssl_cert_reqs", "0, 1 or 2",
           config.ssl_cert_reqs)  # fmt: skip
    for name in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
        path = getattr(config, name)
        _check(
            path is None or (isinstance(path, str) and os.path.isfile(path)), name, "an existing file", path
        )
    if (config.ssl_keyfile is None) != (config.ssl_certfile is None):
        raise ValueError("serve options ssl_keyfile and ssl_certfile go together: HTTPS needs both")
    if config.ssl_certfile is None:
        for name in ("ssl_ca_certs", "ssl_cert_reqs"):
            if getattr(config, name):  # client certificates are asked for in a TLS handshake
                raise ValueError(f"serve option {name} needs ssl_keyfile and ssl_certfile (HTTPS)")
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(
            f"serve options ssl_certfile {config.ssl_certfile!r} and ssl_keyfile {config.ssl_keyfile!r} do not "
            f"load as a certificate chain and its key: {exc}"
        ) from None
    if config.ssl_ca_certs is not None:
        try:
            context.load_verify_locations(config.ssl_ca_certs)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(
                f"serve option ssl_ca_certs {config.ssl_ca_certs!r} holds no CA certificate that loads: {exc}"
            ) from None


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(ok: bool, name: str, allowed: str, value: object) -> None:
    if not ok:
        raise ValueError(f"serve option {name} must be {allowed}, got {value!r:.80}")


class AdmissionGate:
    """Counts completions in flight: a full batch plus `max_queued` may wait; beyond that, 503.

    Behind `share` API server processes, each admits its share of that bound, and an idle one still
    takes a single request up to the whole bound, so what is valid does not depend on the process a
    connection lands on. Touched only from the server's event loop, so it needs no lock.
    """

    def __init__(self, batch_slots: int, max_queued: int, share: int = 1) -> None:
        self.bound = batch_slots + max_queued
        self.capacity = -(-self.bound // share)
        self.in_flight = 0
        self.draining = False

    def enter(self, completions: int) -> None:
        if self.draining:
            raise Unavailable("the server is shutting down")
        if completions > self.bound:
            raise RequestInvalid(f"n is {completions}, above this server's bound of {self.bound}", "n")
        if self.in_flight and self.in_flight + completions > self.capacity:
            raise Unavailable(
                f"the server is at capacity ({self.in_flight} completions in flight, bound {self.capacity}); "
                "retry later"
            )
        self.in_flight += completions

    def leave(self, completions: int) -> None:
        self.in_flight -= completions
