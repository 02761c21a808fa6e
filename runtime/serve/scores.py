"""vLLM's /score and /rerank over `LLM.score`: the cosine similarity of two texts' embeddings, as an
embedding model scores (engine/pooling.py pools them as the server's pooler config says)."""

from __future__ import annotations

import functools

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from .errors import RequestInvalid
from .pooling_call import check_truncation, in_parts, run_pooling
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
    check_truncation(state, body.truncate_prompt_tokens)
    single = len(ones) == 1
    parts = []
    for span in in_parts(len(twos)):
        firsts = ones if single else ones[span.start : span.stop]
        seconds = twos[span.start : span.stop]

        def call(lora, firsts=firsts, seconds=seconds):
            cut = body.truncate_prompt_tokens
            return state.llm.score(
                firsts, seconds, truncate_prompt_tokens=cut, use_tqdm=False, lora_request=lora
            )

        parts.append((call, functools.partial(_locate, body, span.start, len(firsts))))
    pooled = await run_pooling(request, "score", body.model, parts)
    return pooled.list_response(
        [{"index": i, "object": "score", "score": o.outputs.score} for i, o in enumerate(pooled.outs)]
    )


def _locate(body: ScoreRequest, start: int, firsts: int, k: int) -> tuple[str, str]:
    """A part's prompt k -> its field: LLM.score embeds the part's data_1 (one, or the part's) ahead of
    its data_2."""
    if k < firsts:
        return "text_1", "text_1" if isinstance(
            body.text_1, str
        ) else f"text_1[{0 if firsts == 1 and len(body.text_1) == 1 else start + k}]"
    return "text_2", "text_2" if isinstance(body.text_2, str) else f"text_2[{start + k - firsts}]"


async def create_rerank(body: RerankRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    docs = body.documents
    check_truncation(state, body.truncate_prompt_tokens)
    parts = []
    for span in in_parts(len(docs)):

        def call(lora, chunk=docs[span.start : span.stop]):
            cut = body.truncate_prompt_tokens
            return state.llm.score(
                body.query, chunk, truncate_prompt_tokens=cut, use_tqdm=False, lora_request=lora
            )

        def locate(k, start=span.start):
            return ("query", "query") if k == 0 else ("documents", f"documents[{start + k - 1}]")

        parts.append((call, locate))
    pooled = await run_pooling(request, "rerank", body.model, parts)
    outs = pooled.outs
    # Most relevant first; a tie keeps the documents' order (sorted is stable). vLLM's top_n: all
    # documents unless it is positive.
    order = sorted(range(len(docs)), key=lambda i: -outs[i].outputs.score)
    if body.top_n > 0:
        order = order[: body.top_n]
    results = []
    for i in order:
        result = {"index": i, "relevance_score": outs[i].outputs.score}
        if body.return_documents:
            result["document"] = {"text": docs[i]}
        results.append(result)
    return JSONResponse(
        {"id": pooled.rid, "model": pooled.model, "usage": pooled.usage(), "results": results}
    )
