"""Server-sent events, and the end of a request whose client left.

Starlette cancels a streaming response when its client disconnects; SSEResponse then closes the
event generator and the Generation at once, so the engine aborts the request at its next step
instead of whenever the garbage collector gets to it. A plain (non-streamed) response races its
work against the client's disconnect the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from .errors import error_body, error_response
from .generation import Generation
from .responses import SSE_DONE, sse

DRAIN_CUT = "the server shut down before this request finished (its drain bound ran out)"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class SSEResponse(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], generation: Generation) -> None:
        super().__init__(events, headers=SSE_HEADERS)
        self.generation = generation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cut = False
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            if not self.generation.state.gate.draining:
                raise
            cut = True  # the drain's bound ran out: end the stream with a reason, not a traceback
        finally:
            with contextlib.suppress(Exception):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            self.generation.close()
        if cut:
            event = sse(error_body(503, DRAIN_CUT)) + SSE_DONE  # a stream always ends in [DONE]
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": event, "more_body": False})


async def until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, generation: Generation, work: Awaitable[Any]) -> Response:
    """`work`'s response, or, if the client leaves first, abort the generation (nobody reads the reply)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_disconnect(receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        generation.abort()
        return Response(status_code=499)
    except asyncio.CancelledError:
        if not generation.state.gate.draining:
            raise
        return error_response(503, DRAIN_CUT)
    finally:
        watcher.cancel()
        task.cancel()
        generation.close()
