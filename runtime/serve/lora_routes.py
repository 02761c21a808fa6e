"""vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter: adapter names added and removed while the
server runs (ServeConfig.runtime_lora_updating). A name added is checked as --lora-modules' are (its
PEFT header, against this model and the engine's LoRA limits) before any request can use it;
requests already running with a removed name finish with it."""

from __future__ import annotations

import os
import threading

from fastapi import Request
from fastapi.responses import PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from ..engine.lora_request import LoRARequest
from .errors import RequestInvalid, ServeError
from .protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from .state import ServerState

_LOADING = threading.Lock()


async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    llm, name = state.llm, body.lora_name
    if not llm.config.max_loras:
        raise RequestInvalid("this server's engine has LoRA off: start it with --enable-lora", "lora_name")
    if name in state.names:
        raise RequestInvalid(f"{name!r} is the served model's name", "lora_name")
    if body.load_inplace:
        raise RequestInvalid(
            "load_inplace is not supported: unload the adapter, then load it", "load_inplace"
        )
    if name in state.adapters:
        raise RequestInvalid(f"The lora adapter {name!r} has already been loaded.", "lora_name")
    if not os.path.isfile(os.path.join(os.path.expanduser(body.lora_path), "adapter_config.json")):
        raise ServeError(f"No adapter found for {name!r} at {body.lora_path!r}", "lora_path", 404)
    try:
        # The header is read from disk, off the event loop; one load at a time, so two new folders
        # never draw the same fresh id.
        adapter = await run_in_threadpool(_checked, llm, name, body.lora_path)
    except (ValueError, TypeError, OSError) as exc:
        raise RequestInvalid(str(exc), "lora_path") from None
    if name in state.adapters:  # another load of this name won while this one read its header
        raise RequestInvalid(f"The lora adapter {name!r} has already been loaded.", "lora_name")
    state.adapters[name] = adapter
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


def _checked(llm, name: str, path: str) -> LoRARequest:
    # A fresh id each load, as vLLM gives: a folder unloaded, rewritten and loaded again is read again.
    with _LOADING:
        return llm.check_lora(LoRARequest(name, llm.lora_id_for(path, fresh=True), path))


async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    name = body.lora_name
    adapter = state.adapters.get(name)
    if adapter is None:
        raise ServeError(f"The lora adapter {name!r} cannot be found.", "lora_name", 404)
    del state.adapters[name]
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
