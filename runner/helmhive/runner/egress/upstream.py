"""The egress proxy's client for its upstreams, and why a credential in a URL is never logged.

httpx's client logs every request it sends, URL and all (``HTTP Request: GET https://...``, logger
``httpx``, INFO -- the runner's level). A request whose key rides in its query (``?key=``, as
Gemini's tools send it) would put the credential in that line. So the proxy asks the client for
the URL with the placeholder where the key goes (:func:`build_upstream_request`), and the
credential goes in below the client, in :class:`_CredentialURLTransport`, as the request leaves:
the client only ever sees, and logs, the placeholder. Auth headers are never logged by httpx.

The client verifies TLS against the system's authorities or ``egress.caBundle``, ignores the
runner's proxy variables, and follows no redirects.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx

__all__ = ["build_upstream_client", "build_upstream_request"]

_REAL_URL = "helmhive.real_url"
"""The request extension that carries the URL to send (credential included) past the client."""


class _CredentialURLTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        real = request.extensions.get(_REAL_URL)
        if isinstance(real, httpx.URL):
            # A new request, not this one changed: the client logs the request it built, once
            # the response has come, and that one must keep the placeholder.
            request = httpx.Request(
                request.method,
                real,
                headers=request.headers,
                stream=request.stream,
                extensions={k: v for k, v in request.extensions.items() if k != _REAL_URL},
            )
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def build_upstream_client(ca_bundle: Path | None) -> httpx.AsyncClient:
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_bundle)) if ca_bundle else True
    transport = httpx.AsyncHTTPTransport(
        verify=verify, trust_env=False, limits=httpx.Limits(max_connections=None, max_keepalive_connections=32)
    )
    return httpx.AsyncClient(
        transport=_CredentialURLTransport(transport),
        trust_env=False,
        follow_redirects=False,
        timeout=httpx.Timeout(30.0, read=None),
    )


def build_upstream_request(
    client: httpx.AsyncClient,
    method: str,
    *,
    shown: httpx.URL,
    real: httpx.URL,
    headers: list[tuple[bytes, bytes]],
    content: bytes,
) -> httpx.Request:
    """A request for ``real`` that the client knows (and logs) as ``shown``: the same URL with the
    placeholder where ``real`` has the credential."""
    extensions = {_REAL_URL: real} if real != shown else None
    return client.build_request(method, shown, headers=headers, content=content, extensions=extensions)
