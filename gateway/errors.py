"""The one place where errors become HTTP answers.

Every failure is a JSON document ``{"code", "error", "message", "retriable"}`` with the
catalogue's code (common/errors.py) and, as status, the class's ``http_status`` through
the table below. Limits answer 413 (``LimitExceeded``: repeating cannot succeed) or 429
(``TooManyRequests``: come back later), and 429 and 503 carry ``Retry-After``. A broker
failure the catalogue rates 500 (``BrokerError``, an unknown server error) answers 502:
the gateway worked, the broker behind it did not. Only a bug in the gateway answers
500, and it is logged with its traceback.

aiohttp's own refusals (no such route, wrong method, body over ``client_max_size``) get
the same document shape.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from aiohttp import web

from common import errors
from common.errors import MagnetarError

log = logging.getLogger(__name__)

# Statuses the gateway answers differently from the catalogue's http_status.
_STATUS_OVERRIDES: dict[int, int] = {500: 502}
_RETRY_AFTER_STATUSES = (429, 503)


def error_document(error: MagnetarError) -> dict:
    return {"code": error.code, "error": type(error).__name__, "message": error.message,
            "retriable": error.retriable}


def status_of(error: MagnetarError) -> int:
    return _STATUS_OVERRIDES.get(error.http_status, error.http_status)


def error_response(error: MagnetarError, retry_after_s: int) -> web.Response:
    status = status_of(error)
    headers = {"Retry-After": str(retry_after_s)} if status in _RETRY_AFTER_STATUSES else None
    return web.json_response(error_document(error), status=status, headers=headers)


# What a 404 tells the caller: the shape every topic path has, so a path that lost a
# segment (most often the namespace: /v1/topics/persistent/public/orders/message) says
# what was expected instead of a bare "not found".
_TOPIC_PATH_SHAPE = "/v1/topics/persistent/{tenant}/{namespace}/{topic}"
_TOPIC_PATH_EXAMPLE = "/v1/topics/persistent/public/default/orders/message"


def _not_found(path: str) -> MagnetarError:
    if path.startswith("/v1/topics/"):
        return errors.NotFound(
            f"no such resource: {path}; topic paths are {_TOPIC_PATH_SHAPE}/<operation> (the tenant and "
            f"namespace are both needed, e.g. {_TOPIC_PATH_EXAMPLE}); /v1/openapi.json lists every path")
    return errors.NotFound(f"no such resource: {path}; /v1/openapi.json lists every path "
                           f"(topics are under {_TOPIC_PATH_SHAPE})")


def _from_http_exception(exception: web.HTTPException, path: str) -> MagnetarError:
    """The catalogue error standing for one of aiohttp's refusals."""
    if exception.status == 404:
        return _not_found(path)
    if exception.status == 413:
        error: MagnetarError = errors.LimitExceeded.__new__(errors.LimitExceeded)
        MagnetarError.__init__(error, f"request body exceeds the limit: {exception.text or exception.reason}")
        return error
    if exception.status == 405:
        return errors.InvalidArgument(f"method not allowed: {exception.reason}")
    return errors.InvalidArgument(f"{exception.status} {exception.reason}")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def errors_middleware(retry_after_s: int):
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except MagnetarError as error:
            return error_response(error, retry_after_s)
        except web.HTTPException as exception:
            if exception.status < 400:
                raise
            error = _from_http_exception(exception, request.path)
            response = web.json_response(error_document(error), status=exception.status)
            if exception.status == 405 and "Allow" in exception.headers:
                response.headers["Allow"] = exception.headers["Allow"]
            return response
        except ConnectionResetError:
            raise   # the client went away; nothing to answer
        except TimeoutError:
            return error_response(errors.OperationTimeout("the operation timed out"), retry_after_s)
        except Exception:
            log.exception("gateway handler failed: method=%s path=%s", request.method, request.path)
            return web.json_response({"code": errors.UnknownError.code, "error": "InternalError",
                                      "message": "the gateway failed to handle the request (a bug: see its log)",
                                      "retriable": False}, status=500)
    return middleware


def limits_middleware(requests_in_flight_max: int, retry_after_s: int, counter: list[int]):
    """Refuses requests past ``requests_in_flight_max`` at once with 429; ``counter``
    ([in flight]) is shared with the metrics."""
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if counter[0] >= requests_in_flight_max:
            return error_response(errors.TooManyRequests(
                f"the gateway is handling {requests_in_flight_max} requests already"), retry_after_s)
        counter[0] += 1
        try:
            return await handler(request)
        finally:
            counter[0] -= 1
    return middleware
