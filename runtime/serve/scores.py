"""vLLM's /score and /rerank over `LLM.score`: the cosine similarity of two texts' embeddings, as an
embedding model scores (engine/pooling.py pools them as the server's pooler config says)."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from .errors import RequestInvalid
from .pooling_call import run_pooling, usage
from .protocol import RerankRequest, ScoreRequest
from .state import ServerState


async def create_score(body: ScoreRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    ones = [body.text_1] if isinstance(body.text_1, str) else body.text_1
    twos = [body.text_2] if isinstance(body.text_2, str) else body.text_2
    if len(ones) != 1 and len(ones) != len(twos):
        raise RequestInvalid(
            f"text_1: one text, or as many as text_2 ({len(twos)}); got {len(ones)}", "text_1"
        )
    rid, outs = await run_pooling(
        request,
        "score",
        body.model,
        lambda: state.llm.score(
            ones, twos, truncate_prompt_tokens=body.truncate_prompt_tokens, use_tqdm=False
        ),
        lambda message: "text_1",
    )
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    request.state.prompt_tokens = tokens
    data = [{"index": i, "object": "score", "score": o.outputs.score} for i, o in enumerate(outs)]
    return JSONResponse(
        {
            "id": rid,
            "object": "list",
            "created": int(time.time()),
            "model": state.model_name,
            "data": data,
            "usage": usage(tokens),
        }
    )


async def create_rerank(body: RerankRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    docs = body.documents
    rid, outs = await run_pooling(
        request,
        "rerank",
        body.model,
        lambda: state.llm.score(
            body.query, docs, truncate_prompt_tokens=body.truncate_prompt_tokens, use_tqdm=False
        ),
        lambda message: "documents",
    )
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    request.state.prompt_tokens = tokens
    # Most relevant first; a tie keeps the documents' order (sorted is stable).
    order = sorted(range(len(docs)), key=lambda i: -outs[i].outputs.score)
    if body.top_n:
        order = order[: body.top_n]
    results = []
    for i in order:
        result = {"index": i, "relevance_score": outs[i].outputs.score}
        if body.return_documents:
            result["document"] = {"text": docs[i]}
        results.append(result)
    return JSONResponse({"id": rid, "model": state.model_name, "usage": usage(tokens), "results": results})
