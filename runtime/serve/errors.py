"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}`, one shape for every status."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    503: "service_unavailable",
}


class ServeError(Exception):
    """An error the client gets as an OpenAI error body with this status."""

    status = 500

    def __init__(self, message: str, param: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if status is not None:
            self.status = status


class RequestInvalid(ServeError):
    status = 400


class Unavailable(ServeError):
    """Overloaded, draining or closed: try again later (or elsewhere)."""

    status = 503


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "server_error"),
            "param": param,
            "code": status,
        }
    }


def error_response(status: int, message: str, param: str | None = None, **headers: str) -> JSONResponse:
    from fastapi.responses import JSONResponse  # here, so the command line loads without the extra

    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers or None)


def validation_param(loc: tuple[Any, ...]) -> str | None:
    """A pydantic error location as the request key it blames: ('body', 'messages', 0, 'content') ->
    'messages.0.content'. Union branches pydantic tried (`str`, `list[...]`) are left out."""
    parts = [str(p) for p in loc[1:] if not _is_union_branch(p)] if loc[:1] == ("body",) else []
    return ".".join(parts) or None


def _is_union_branch(part: Any) -> bool:
    # A model branch goes by its class name (NamedToolChoice); request keys are snake_case.
    if isinstance(part, str) and part[:1].isupper() and part.isidentifier():
        return True
    return isinstance(part, str) and (part[:1].islower() and ("[" in part or part in _BRANCH_NAMES))


_BRANCH_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "function-after", "constrained-int"}
