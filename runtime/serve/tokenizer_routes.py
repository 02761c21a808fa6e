"""vLLM's utility routes beside the OpenAI ones: POST /tokenize, POST /detokenize, GET /version.

Clients use them to count a prompt's tokens against the context before sending it, and to see the
exact ids a chat renders to. Both use the served model's own tokenizer and chat template, so their
answers are what /v1/completions and /v1/chat/completions would see.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from fastpath.vocab import DISTRIBUTION

from .errors import RequestInvalid
from .protocol import DetokenizeRequest, TokenizeRequest
from .state import ServerState


async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    state.check_model(body.model)
    state.check_chat_template(body.chat_template)
    tok = tokenizer_of(state)
    if body.messages is not None:
        ids = await run_in_threadpool(render_chat_ids, state, body)
    else:
        add = True if body.add_special_tokens is None else body.add_special_tokens
        try:
            ids = list((await run_in_threadpool(tok, body.prompt, add_special_tokens=add))["input_ids"])
        except (TypeError, ValueError) as exc:  # text the tokenizer cannot take (a lone surrogate)
            raise RequestInvalid(f"prompt: the tokenizer cannot encode it: {exc}", "prompt") from None
    reply: dict[str, Any] = {"count": len(ids), "max_model_len": state.llm.config.max_seq_len, "tokens": ids}
    if body.return_token_strs:
        reply["token_strs"] = tok.convert_ids_to_tokens(ids)
    return JSONResponse(reply)


async def detokenize(body: DetokenizeRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    state.check_model(body.model)
    tok = tokenizer_of(state)
    vocab = state.llm.config.model.vocab_size
    bad = next((t for t in body.tokens if t >= vocab), None)
    if bad is not None:
        raise RequestInvalid(f"tokens: token id {bad} is out of range for a vocabulary of {vocab}", "tokens")
    text = await run_in_threadpool(tok.decode, body.tokens)
    return JSONResponse({"prompt": text})


async def version(request: Request) -> Response:
    try:
        number = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        number = "unknown"
    return JSONResponse({"version": number})


def tokenizer_of(state: ServerState) -> Any:
    tok = state.llm.get_tokenizer()
    if tok is None:
        raise RequestInvalid("this model has no tokenizer: send token ids to the completions route", None)
    return tok


def render_chat_ids(state: ServerState, body: Any) -> list[int]:
    """The token ids of a body's `messages` (and `tools`, where it has them) as its chat template and
    template options render them; a template's error is a 400 naming `messages`."""
    tools = getattr(body, "tools", None)
    try:
        rendered = state.llm.render_chat(
            [m.as_template_dict() for m in body.messages or ()],
            body.chat_template,
            body.add_generation_prompt,
            body.continue_final_message,
            body.chat_template_kwargs,
            [t.as_template_dict() for t in tools] if tools else None,
        )
    except Exception as exc:  # the template's own error names it
        raise RequestInvalid(f"messages: the chat template failed: {exc}", "messages") from None
    if body.add_special_tokens:  # as vLLM: the rendered text encoded again, special tokens added
        return list(state.llm.get_tokenizer()(rendered["prompt"], add_special_tokens=True)["input_ids"])
    return list(rendered["prompt_token_ids"])
