"""The FastAPI app over one engine: OpenAI's /v1 routes, /health and /metrics.

`build_app(llm, config)` is all a caller needs; `fastpath.runtime.serve.server.serve` runs it under
uvicorn with the drain on SIGTERM. Errors of every kind leave as OpenAI error bodies.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from ..engine.lora_request import LoRARequest
from ..engine.outputs import EngineClosedError
from .chat import create_chat_completion
from .completions import create_completion
from .config import AdmissionGate, ServeConfig
from .embeddings import create_embedding
from .errors import ServeError, error_response
from .lora_routes import load_lora_adapter, unload_lora_adapter
from .metrics import ServerMetrics
from .middleware import RequestMiddleware
from .openai_responses import create_response, stored_response
from .scores import create_rerank, create_score
from .state import ServerState
from .tokenizer_routes import detokenize, tokenize, version
from .validation import explain

# What metrics label requests by; any other path counts as "other", so a scan cannot grow the labels.
ROUTES = frozenset(
    {
        "/health",
        "/ping",
        "/metrics",
        "/v1/models",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
        "/docs",
        "/openapi.json",
        "/tokenize",
        "/detokenize",
        "/version",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
    }
)


def build_app(llm: Any, config: ServeConfig | None = None, *, model_name: str | None = None) -> FastAPI:
    """An app serving `llm` (a fastpath.runtime.LLM). The served model name is config.served_model_name,
    else `model_name` (what the command line named), else the engine's model. Behind
    `config.api_server_count` processes, each one's admission gate takes its share of the bounds."""
    config = config or ServeConfig()
    names, adapters = check_serving(llm, config, model_name)
    if config.chat_template is not None:  # every process renders with it, as the tokenizer's own
        llm.get_tokenizer().chat_template = config.chat_template
    state = ServerState(
        llm=llm,
        config=config,
        model_name=names[0],
        aliases=tuple(names[1:]),
        gate=AdmissionGate(llm.config.max_batch_size, config.max_queued_requests, config.api_server_count),
        metrics=ServerMetrics(llm.stats, names[0], llm.config.max_seq_len),
        created=int(time.time()),
        routes=ROUTES,
        adapters=adapters,
        model_path=model_name or _engine_model_name(llm),
    )
    docs = {} if config.fastapi_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="fastpath", summary="An OpenAI-compatible server for a fastpath engine", **docs)
    app.state.fastpath = state
    app.add_middleware(RequestMiddleware, state=state)
    if config.allowed_origins:  # outermost: a preflight is answered before anything else runs
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.allowed_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["x-request-id"],
        )
    _errors(app)
    app.include_router(_public_routes())
    app.include_router(_v1_routes(), prefix="/v1", dependencies=[Depends(_require_api_key)])
    if config.runtime_lora_updating:
        app.include_router(_lora_routes(), prefix="/v1", dependencies=[Depends(_require_api_key)])
    app.include_router(_utility_routes(), dependencies=[Depends(_require_api_key)])
    return app


def check_serving(
    llm: Any, config: ServeConfig, model_name: str | None = None
) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(the served names, the LoRA modules' requests), once what `config` asks of this engine is checked: a chat template needs a
    tokenizer, and each LoRA module an engine with LoRA on and an adapter it can run. ValueError
    naming the option; the command line calls it before any API server starts."""
    if config.chat_template is not None and llm.get_tokenizer() is None:
        raise ValueError("chat_template: this model has no tokenizer to render chats with")
    served = config.served_model_name
    names = (served,) if isinstance(served, str) else served or (model_name or _engine_model_name(llm),)
    return names, _adapters(llm, config, names)


def _adapters(llm: Any, config: ServeConfig, names: tuple[str, ...]) -> dict[str, Any]:
    """--lora-modules as LoRARequests, each checked now: a server never starts with an adapter its
    model cannot run."""
    if not config.lora_modules:
        return {}
    if not llm.config.max_loras:
        raise ValueError("lora_modules need an engine with LoRA on (--enable-lora, LLM(enable_lora=True))")
    out = {}
    for name, path in config.lora_modules:
        if name in names:
            raise ValueError(f"lora_modules: {name!r} is also the served model's name")
        out[name] = llm.check_lora(LoRARequest(name, llm.lora_id_for(path), path))
    return out


def _engine_model_name(llm: Any) -> str:
    cfg = llm.config
    return str(cfg.checkpoint) if cfg.checkpoint is not None else f"random:{cfg.model.name}"


def _errors(app: FastAPI) -> None:
    @app.exception_handler(ServeError)
    async def serve_error(request: Request, exc: ServeError) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
        if exc.status == 503:
            headers["Retry-After"] = "1"
        return error_response(exc.status, exc.message, exc.param, **headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        # The deepest error is the most specific: inside a union, the branch that got furthest.
        param, message = explain(exc.errors())
        return error_response(400, f"{param}: {message}" if param else message, param)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(EngineClosedError)
    async def closed(request: Request, exc: EngineClosedError) -> Response:
        return error_response(503, str(exc))


async def _require_api_key(request: Request) -> None:
    key = request.app.state.fastpath.config.api_key
    if key is None:
        return
    keys = (key,) if isinstance(key, str) else key
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = token.strip().encode()
    # Every key compared, whichever matches: the time taken tells nothing about which one.
    matches = [hmac.compare_digest(given, k.encode()) for k in keys]
    if scheme.lower() != "bearer" or not any(matches):
        raise ServeError("a valid API key is needed: Authorization: Bearer <key>", None, 401)


def _each_method(router: APIRouter, path: str, endpoint: Any, *methods: str) -> None:
    """One route a method: FastAPI names an operation by its route's first method, so one route of
    several methods gives /openapi.json duplicate operation ids (and a warning each time it is built)."""
    for method in methods:
        router.add_api_route(path, endpoint, methods=[method], name=f"{endpoint.__name__}_{method.lower()}")


def _public_routes() -> APIRouter:
    router = APIRouter()

    async def health(request: Request) -> Response:
        state: ServerState = request.app.state.fastpath
        if state.gate.draining:
            return error_response(503, "the server is shutting down")
        reason = state.closed_reason()
        if reason is not None:
            return error_response(503, f"the engine is closed: {reason}")
        return JSONResponse({"status": "ok"})

    # /ping is vLLM's (SageMaker's) spelling; HEAD is what some load balancers probe with.
    _each_method(router, "/health", health, "GET", "HEAD")
    _each_method(router, "/ping", health, "GET", "POST", "HEAD")

    @router.get("/metrics")
    async def metrics(request: Request) -> Response:
        registry = request.app.state.fastpath.metrics.registry
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    adapter = state.adapters.get(name)
    return {
        "id": name,
        "object": "model",
        "created": state.created,
        "owned_by": "fastpath",
        # vLLM's: the base model's root is the model the server was started with, under any served
        # name; an adapter's root is its folder and its parent the base model.
        "root": adapter.lora_path if adapter is not None else state.model_path or name,
        "parent": state.model_name if adapter is not None else None,
        "max_model_len": state.llm.config.max_seq_len,
        "permission": [_permission(state, name)],
    }


def _permission(state: ServerState, name: str) -> dict[str, Any]:
    """vLLM's model_permission card (OpenAI's older field): everything allowed, nothing fine-tuned."""
    return {
        "id": f"modelperm-{name}",
        "object": "model_permission",
        "created": state.created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


def _v1_routes() -> APIRouter:
    router = APIRouter()

    @router.get("/models")
    async def models(request: Request) -> Response:
        state: ServerState = request.app.state.fastpath
        names = [*state.names, *state.adapters]
        return JSONResponse({"object": "list", "data": [_model_card(state, name) for name in names]})

    @router.get("/models/{model:path}")
    async def model(model: str, request: Request) -> Response:
        state: ServerState = request.app.state.fastpath
        state.check_model(model)
        return JSONResponse(_model_card(state, model))

    router.add_api_route("/completions", create_completion, methods=["POST"])
    router.add_api_route("/chat/completions", create_chat_completion, methods=["POST"])
    router.add_api_route("/responses", create_response, methods=["POST"])
    _each_method(router, "/responses/{response_id}", stored_response, "GET", "DELETE")
    router.add_api_route("/responses/{response_id}/cancel", stored_response, methods=["POST"])
    router.add_api_route("/embeddings", create_embedding, methods=["POST"])
    router.add_api_route("/score", create_score, methods=["POST"])
    router.add_api_route("/rerank", create_rerank, methods=["POST"])
    return router


def _lora_routes() -> APIRouter:
    router = APIRouter()
    router.add_api_route("/load_lora_adapter", load_lora_adapter, methods=["POST"])
    router.add_api_route("/unload_lora_adapter", unload_lora_adapter, methods=["POST"])
    return router


def _utility_routes() -> APIRouter:
    """vLLM's routes outside /v1; behind the API key too, when one is set."""
    router = APIRouter()
    router.add_api_route("/tokenize", tokenize, methods=["POST"])
    router.add_api_route("/detokenize", detokenize, methods=["POST"])
    router.add_api_route("/version", version, methods=["GET"])
    router.add_api_route("/score", create_score, methods=["POST"])
    router.add_api_route("/rerank", create_rerank, methods=["POST"])
    router.add_api_route("/v2/rerank", create_rerank, methods=["POST"])
    return router
