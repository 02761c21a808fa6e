"""The ASGI layer every request passes: the body size limit, the request id, the access log, the
per-route request counter. Pure ASGI (not BaseHTTPMiddleware), so streams pass through untouched."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_response
from .state import ServerState

access_log = logging.getLogger("fastpath.serve.access")


class RequestMiddleware:
    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.state.config.root_path:
            # The app's root path, as vLLM sets it on its FastAPI app (not uvicorn's, which would put
            # it in front of every path): /prefix/v1/... (a proxy that keeps the prefix) and /v1/...
            # (one that strips it) are both served, and /openapi.json names the prefix.
            scope["root_path"] = self.state.config.root_path
        start = time.monotonic()
        info: dict[str, Any] = scope.setdefault("state", {})
        status = 500
        limit = self.state.config.max_request_bytes
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            status = 413
            response = error_response(
                413, f"the request body is larger than this server's limit of {limit} bytes"
            )
            await response(scope, receive, send)
            self._log(scope, info, status, start)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(
                        413, f"the request body is larger than this server's limit of {limit} bytes"
                    )
            return message

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                # The client's own id as it sent it, as vLLM echoes it; else the response's.
                rid = info.get("client_request_id") or info.get("request_id")
                if rid is not None:
                    message = {
                        **message,
                        "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())],
                    }
            await send(message)

        try:
            await self.app(scope, limited_receive, observed_send)
        finally:
            self._log(scope, info, status, start)

    def _log(self, scope: Scope, info: dict[str, Any], status: int, start: float) -> None:
        path = route_path(scope)
        label = path if path in self.state.routes else "other"
        self.state.metrics.requests.labels(label, str(status)).inc()
        if not self.state.config.access_log or not access_log.isEnabledFor(logging.INFO):
            return
        client = scope.get("client")
        record = {
            "event": "http_request",
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "duration_ms": round((time.monotonic() - start) * 1000, 3),
            "client": f"{client[0]}:{client[1]}" if client else None,
            "request_id": info.get("request_id"),
            "prompt_tokens": info.get("prompt_tokens"),
            "completion_tokens": info.get("completion_tokens"),
            "pid": os.getpid() if self.state.config.api_server_count > 1 else None,  # which API server
            **info.get("timeline", {}),  # queue_ms, ttft_ms: where a slow first token waited
        }
        access_log.info(json.dumps({k: v for k, v in record.items() if v is not None}))


def route_path(scope: Scope) -> str:
    """The path the app routes by: uvicorn puts --root-path in front of the request's own path."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
