"""Every refusal of the OpenAI endpoint in OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`,
one line: the routes' own, and what FastAPI would answer itself (404, 405, a malformed request) or an unexpected
failure (500, no traceback: that goes to the server's log)."""

from __future__ import annotations

import logging

log = logging.getLogger("mmtrt.serve")
MAX_MESSAGE = 400
KINDS = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
         413: "invalid_request_error", 429: "rate_limit_error", 503: "unavailable_error"}


def one_line(message: str) -> str:
    """The message on one line, at most MAX_MESSAGE characters (a hostile value quoted back stays short)."""
    text = " ".join(str(message).split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


def error(status: int, message: str, kind: str | None = None):
    """The JSONResponse of one refusal."""
    from fastapi.responses import JSONResponse

    kind = kind or KINDS.get(status, "server_error")
    return JSONResponse({"error": {"message": one_line(message), "type": kind, "param": None, "code": status}},
                        status_code=status)


def install(app) -> None:
    """The handlers that give FastAPI's own answers (and a failure) OpenAI's shape."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        message = {404: f"no route {request.url.path}; the routes are /v1/models, /v1/chat/completions, /health, "
                        "/ready and /metrics",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
        return error(exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        return error(400, "the request is malformed; send a JSON chat completion body")

    @app.exception_handler(Exception)
    async def failed(request, exc: Exception):
        log.exception("request %s failed", request.url.path)
        return error(500, "the server failed on this request (an internal error, logged on the server)")
