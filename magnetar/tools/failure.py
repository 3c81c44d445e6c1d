"""The last line a ``magnetar`` tool prints on stderr when it fails, and the JSON it
prints on stdout when an action succeeded with nothing to show.

Every tool ends a failure with one line of the same shape, so a user (or a script:
``magnetar ... 2>&1 | tail -1``) always finds the cause in one place:

    magnetar admin: PUT http://127.0.0.1:8080/admin/v2/namespaces/my-tenant/my-ns: HTTP 404:
        tenant my-tenant does not exist [TenantNotFound, code 4015]

(on one line): what failed, the broker's own reason, and the error's class and code in
the catalogue (common/errors.py). The code is the broker's when it sent one (the admin
REST's error body carries it); otherwise it is the catalogue class that stands for what
the tool saw (an HTTP status without a Magnetar body, a Pulsar ServerError code, a
refused connection).
"""

from __future__ import annotations

import sys

from common import errors

# A refusal whose body names no catalogue code (a Pulsar broker, a proxy's error page),
# by HTTP status: the catalogue class with that status that a caller would act on.
_BY_HTTP_STATUS: dict[int, type[errors.MagnetarError]] = {
    400: errors.InvalidArgument,
    401: errors.Unauthorized,
    403: errors.AuthorizationDenied,
    404: errors.NotFound,
    409: errors.AlreadyExists,
    412: errors.PreconditionFailed,
    413: errors.LimitExceeded,
    429: errors.TooManyRequests,
    501: errors.NotSupported,
    503: errors.ServiceNotReady,
    504: errors.OperationTimeout,
}


def catalogue_tag(error_name: str, code: int) -> str:
    return f"[{error_name}, code {code}]"


def class_for_status(status: int | None) -> type[errors.MagnetarError]:
    """The catalogue class for an HTTP status; no status (no answer at all) is
    ServiceNotReady: the broker could not be reached, try again."""
    if status is None:
        return errors.ServiceNotReady
    return _BY_HTTP_STATUS.get(status, errors.BrokerError)


def failure_line(tool: str, what: str, reason: str, error_name: str, code: int) -> str:
    text = f"{what}: {reason}" if what else reason
    # One line whatever the reason held (a broker's reason is free text).
    text = " ".join(text.split())
    return f"magnetar {tool}: {text} {catalogue_tag(error_name, code)}"


def print_failure(tool: str, what: str, reason: str, error_name: str, code: int) -> None:
    print(failure_line(tool, what, reason, error_name, code), file=sys.stderr, flush=True)


def usage_failure(tool: str, reason: str) -> None:
    """A command line the tool refuses before asking any server."""
    print_failure(tool, "", reason, errors.InvalidArgument.__name__, errors.InvalidArgument.code)


def report_admin_error(tool: str, error) -> None:
    """The last line for an admin REST call that failed (an ``AdminError``): the body's
    catalogue code when a Magnetar broker sent one, else the class for the status."""
    where = f"HTTP {error.status}" if error.status is not None else "no response"
    if error.code is not None and error.error is not None:
        name, code = error.error, error.code
    else:
        cls = class_for_status(error.status)
        name, code = cls.__name__, cls.code
    print_failure(tool, f"{error.method} {error.url}: {where}", error.reason, name, code)
