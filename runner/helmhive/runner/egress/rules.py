"""The egress proxy's pure rules: where a request goes, which headers it carries, what the agent is told.

:mod:`helmhive.runner.egress.proxy` does the I/O; everything here is pure and shared with the tests. See
that module for what the proxy is; :mod:`helmhive.runner.egress.limits` for its per-job bounds and
:mod:`helmhive.runner.egress.pods` for which job a job pod's request is.

What the agent holds in place of the key -- the *token* the proxy swaps for the credential -- is
:data:`PLACEHOLDER` on a job's own listener (the listener says whose request it is) and the job's
phantom key on the job pods' shared listener (the key says whose request it is).
"""

from __future__ import annotations

import enum
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import httpx
from pydantic import SecretStr

from helmhive.api.egress import EgressSpec, provider_egress
from helmhive.api.jobpod import EGRESS_RELAY_PORT
from helmhive.runner.egress.limits import RequestLimits, decide_path

__all__ = [
    "AUTH_HEADERS",
    "BASE_URL_ENV",
    "DEFAULT_LIMITS",
    "HOP_BY_HOP",
    "MAX_BODY_BYTES",
    "PLACEHOLDER",
    "REFUSAL_STATUS",
    "EgressEndpoint",
    "Refusal",
    "RefusalReason",
    "Route",
    "build_injected_url",
    "build_pod_proxy_env",
    "build_proxy_env",
    "build_request_limits",
    "build_upstream_headers",
    "decide_egress_route",
]

PLACEHOLDER = "helmhive-egress-placeholder"
"""What the agent holds instead of the key. Not a secret: only the proxy can turn it into the key."""
AUTH_HEADERS = frozenset({"authorization", "x-api-key", "x-goog-api-key", "api-key"})
MAX_BODY_BYTES = 32 * 1024 * 1024
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)


class RefusalReason(enum.StrEnum):
    CONNECT = "connect"
    """A CONNECT request: the proxy opens no tunnels."""
    HOST = "host"
    """A host that is neither the upstream's nor allowed (by ``Host`` or an absolute URI)."""
    TARGET = "target"
    """A request target that is neither a path nor an ``http(s)`` URI."""
    NO_UPSTREAM = "no-upstream"
    """The pool has no upstream (a provider without defaults, or the reference agent)."""
    NO_CREDENTIAL = "no-credential"
    """The credential is gone (revoked and wiped)."""
    TOO_LARGE = "too-large"
    PATH = "path"
    """A path of the upstream outside ``egress.allowedPaths``."""
    PATH_SUSPICIOUS = "path-suspicious"
    """Dot or empty segments, a backslash or an encoded separator: the upstream might read another path."""
    RATE = "rate"
    """The job sent more than ``egress.requestsPerMinute`` (beyond its ``burst``)."""
    CONCURRENCY = "concurrency"
    """The job already had ``egress.maxConcurrentRequests`` requests in flight."""
    KEY = "key"
    """On the job pods' listener: no phantom key, one no open job holds (the placeholder included), or two."""
    PEER = "peer"
    """A connection to a job's socket from a process that is not that job's (``SO_PEERCRED``), or a
    job's phantom key from an address that is not its job pod's (another pod replaying it)."""
    REVOKED = "revoked"
    """The job has ended (cancelled, timed out, or its agent's last turn is over): its placeholder
    (or phantom key) is void."""


REFUSAL_STATUS = {
    RefusalReason.NO_CREDENTIAL: 503,
    RefusalReason.TOO_LARGE: 413,
    RefusalReason.RATE: 429,
    RefusalReason.CONCURRENCY: 429,
}


@dataclass(frozen=True, slots=True)
class Route:
    """Where to forward one request."""

    url: httpx.URL
    inject: bool
    """Whether the placeholder becomes the credential (only for the upstream's own host)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: RefusalReason
    host: str = ""
    """The host asked for, for the log (cut short; never a credential: the agent holds none)."""
    job: str = ""
    """The job whose request it was, when the listener knows (the job pods' listener), for the log."""
    peer: str = ""
    """The job pod's address that sent it (the job pods' listener), for the log."""


@dataclass(frozen=True, slots=True)
class EgressEndpoint:
    """How an agent reaches the proxy: the runner's loopback, or (a job pod's agent) the shim's
    loopback relay, ``127.0.0.1:``:data:`~helmhive.api.jobpod.EGRESS_RELAY_PORT` in the job pod."""

    port: int
    host: str = "127.0.0.1"

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        return f"http://{host}:{self.port}"


BASE_URL_ENV = "HELMHIVE_PROVIDER_BASE_URL"
"""Always set with Proxy: the proxy's URL, for agents that read no provider-specific variable."""


def build_proxy_env(
    *, provider: str, credential_env_name: str, endpoint: EgressEndpoint, key: SecretStr | None = None
) -> dict[str, str]:
    """The agent's variables with Proxy: the proxy's URL in every base-URL variable its provider's
    tools read (:data:`helmhive.api.egress.PROVIDER_EGRESS`), and the placeholder in the pool's
    ``credential.envName`` (the variable that decides how the agent sends its key) -- or ``key``,
    a job pod's phantom key, which the agent must hold since its key alone says which job it is."""
    defaults = provider_egress(provider)
    token = key.get_secret_value() if key is not None else PLACEHOLDER
    env = {BASE_URL_ENV: endpoint.base_url, credential_env_name: token}
    if defaults is not None:
        env.update({name: endpoint.base_url + defaults.base_url_suffix for name in defaults.base_url_env})
    return env


def build_pod_proxy_env(
    *, provider: str, credential_env_name: str, key: SecretStr, relay_port: int = EGRESS_RELAY_PORT
) -> dict[str, str]:
    """A job pod's agent's variables: the shim's loopback relay (which carries each request, bytes
    unchanged, to the runner's job pod listener) as the base URL, and the job's phantom key."""
    return build_proxy_env(
        provider=provider, credential_env_name=credential_env_name, endpoint=EgressEndpoint(port=relay_port), key=key
    )


def build_request_limits(egress: EgressSpec) -> RequestLimits:
    """One job's bounds from the pool's ``egress`` (pure)."""
    return RequestLimits(
        requests_per_minute=egress.requests_per_minute,
        burst=egress.burst,
        max_concurrent=egress.max_concurrent_requests,
    )


DEFAULT_LIMITS = build_request_limits(EgressSpec())
"""The pool's defaults (``egress.requestsPerMinute``, ``burst``, ``maxConcurrentRequests``)."""


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)[:100]


def _authority(host: str, port: int | None) -> str:
    return host if port is None else f"{host}:{port}"


def decide_egress_route(
    *,
    method: str,
    target: str,
    host_header: str,
    own: frozenset[str],
    upstream: httpx.URL | None,
    allowed_hosts: frozenset[str],
    allowed_paths: Sequence[str] = ("/",),
) -> Route | Refusal:
    """Where one request goes, or why not (pure). ``own`` are the proxy's own authorities;
    ``allowed_paths`` the upstream's paths it may ask for (hosts in ``allowed_hosts`` get any path)."""
    if method.upper() == "CONNECT":
        return Refusal(RefusalReason.CONNECT, _printable(target))
    if target.startswith("/"):
        host = host_header.lower()
        if host in own or (upstream is not None and host in (upstream.host, _authority(upstream.host, upstream.port))):
            if upstream is None:
                return Refusal(RefusalReason.NO_UPSTREAM)
            refused = decide_path(target=target, allowed=allowed_paths)
            if refused is not None:
                return Refusal(RefusalReason(refused.value), _printable(target.split("?", 1)[0]))
            prefix = upstream.raw_path.rstrip(b"/")
            return Route(url=upstream.copy_with(raw_path=prefix + target.encode("ascii")), inject=True)
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name in allowed_hosts:
            return Route(url=httpx.URL(scheme="https", host=name, raw_path=target.encode("ascii")), inject=False)
        return Refusal(RefusalReason.HOST, _printable(host))
    try:
        parts = urllib.parse.urlsplit(target)
        port = parts.port
    except ValueError:
        return Refusal(RefusalReason.TARGET)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host or parts.username is not None or parts.password is not None:
        return Refusal(RefusalReason.TARGET)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if _authority(host, port) in own or (upstream is not None and host == upstream.host and port in (None, 80, 443)):
        return decide_egress_route(
            method=method,
            target=path,
            host_header=host_header if _authority(host, port) in own else host,
            own=own,
            upstream=upstream,
            allowed_hosts=allowed_hosts,
            allowed_paths=allowed_paths,
        )
    if port not in (None, 80, 443):
        return Refusal(RefusalReason.HOST, _printable(_authority(host, port)))
    if host in allowed_hosts:
        return Route(url=httpx.URL(scheme="https", host=host, raw_path=path.encode("ascii")), inject=False)
    return Refusal(RefusalReason.HOST, _printable(host))


def build_upstream_headers(
    headers: Iterable[tuple[bytes, bytes]], *, inject: bool, credential: str, token: str = PLACEHOLDER
) -> list[tuple[bytes, bytes]]:
    """The request's headers for the upstream: hop-by-hop ones dropped, and auth headers carrying
    ``token`` (the placeholder, or the job's phantom key) given the credential when ``inject``
    (every other auth header dropped: on the job pods' listener, one carrying the placeholder too)."""
    out = []
    for raw_name, value in headers:
        name = raw_name.lower()
        if name.decode("latin-1") in HOP_BY_HOP:
            continue
        if name.decode("latin-1") in AUTH_HEADERS:
            text = value.decode("latin-1")
            if inject and token and token in text:
                out.append((name, text.replace(token, credential).encode("latin-1")))
            continue
        out.append((name, value))
    return out


def build_injected_url(url: httpx.URL, credential: str, *, token: str = PLACEHOLDER) -> httpx.URL:
    """``url`` with ``token`` in its query (the ``key`` parameter's) replaced by ``credential``."""
    query = url.query.decode("ascii", errors="replace")
    if not token or token not in query:
        return url
    return url.copy_with(query=query.replace(token, urllib.parse.quote(credential, safe="")).encode("ascii"))
