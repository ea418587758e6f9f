"""The one error tree every door to the Kubernetes API raises, on the operator's side and the runner's.

Pure: no client library is imported here, so the pure core, handlers and tests can name and
catch these errors without loading one. The doors (``docs/architecture.md``, "One door to the
API") translate the client library's exceptions with :func:`build_kube_error` and chain the
original with ``from``::

    KubeError             any failed call; ``status`` (0 without one) and the server's ``message``
     ├── NotFound         404
     ├── Conflict         409: already exists, or a stale resourceVersion
     ├── Forbidden        401, 403: RBAC, admission, or an expired/unbound token
     ├── Invalid          400, 422: the API server refused the object; ``message`` says why
     └── Unavailable      429, 5xx, timeouts, connection errors, no answer at all: worth retrying
"""

from __future__ import annotations

import json

__all__ = [
    "MAX_MESSAGE",
    "Conflict",
    "Forbidden",
    "Invalid",
    "KubeError",
    "NotFound",
    "Unavailable",
    "build_kube_error",
    "build_unavailable",
]

MAX_MESSAGE = 1024
"""The longest message kept (the API server's own words can be long)."""


class KubeError(RuntimeError):
    """An API call failed; ``status`` is the HTTP status (0 without one), ``message`` the server's words."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class NotFound(KubeError):
    """404: the object (or its namespace) does not exist."""


class Conflict(KubeError):
    """409: the object already exists, or the write carried a stale resourceVersion."""


class Forbidden(KubeError):
    """401 or 403: not authenticated, not authorised, or refused by admission."""


class Invalid(KubeError):
    """400 or 422: the API server refused the object or the request; ``message`` says why."""


class Unavailable(KubeError):
    """429, 5xx, or no answer at all (timeout, connection refused or reset): worth retrying later."""


_BY_STATUS: dict[int, type[KubeError]] = {
    400: Invalid,
    401: Forbidden,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Invalid,
}


def build_kube_error(status: int | None, body: str | bytes | None, reason: str | None) -> KubeError:
    """The error for an answer with HTTP ``status``, its ``body`` (a Status object) and ``reason`` phrase."""
    code = int(status or 0)
    try:
        parsed = json.loads(body or "{}")
        message = str((parsed.get("message") if isinstance(parsed, dict) else "") or reason or "")
    except ValueError:
        message = str(reason or "")
    cls = _BY_STATUS.get(code, Unavailable if code == 429 or code >= 500 or code == 0 else KubeError)
    return cls(code, message[:MAX_MESSAGE])


def build_unavailable(exc: BaseException) -> Unavailable:
    """The error for a call that got no answer (the network's or the socket's exception ``exc``)."""
    return Unavailable(0, f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE])
