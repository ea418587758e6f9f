"""The egress proxy on its own: what it forwards where, with which credential, and what it refuses.

A real :class:`~helmhive.runner.egress.proxy.EgressProxy` on loopback in front of a fake provider with a
TLS certificate authority of its own (:mod:`.fake_provider`); requests are real HTTP over sockets.
The fake provider only ever records whether an auth header held the canary key or the placeholder.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from helmhive.runner.egress.proxy import (
    PLACEHOLDER,
    EgressProxy,
    Refusal,
    RefusalReason,
    Route,
    build_proxy_env,
    build_upstream_headers,
    decide_egress_route,
)
from helmhive.runner.metrics import REGISTRY

from .fake_provider import FakeProvider, fake_provider, write_ca_pair

CANARY = "sk-egress-canary-3b9e71c4d2a85f06"
OWN = frozenset({"127.0.0.1:4000", "localhost:4000"})
UPSTREAM = httpx.URL("https://api.anthropic.com")


def route(target: str, *, host: str = "127.0.0.1:4000", method: str = "POST", allowed: tuple[str, ...] = ()) -> object:
    return decide_egress_route(
        method=method, target=target, host_header=host, own=OWN, upstream=UPSTREAM, allowed_hosts=frozenset(allowed)
    )


@pytest.mark.parametrize(
    ("target", "host", "method", "expected"),
    [
        ("/v1/messages?beta=true", "127.0.0.1:4000", "POST", ("https://api.anthropic.com/v1/messages?beta=true", True)),
        ("/v1/messages", "localhost:4000", "POST", ("https://api.anthropic.com/v1/messages", True)),
        ("/v1/models", "api.anthropic.com", "GET", ("https://api.anthropic.com/v1/models", True)),
        ("http://127.0.0.1:4000/v1/models", "127.0.0.1:4000", "GET", ("https://api.anthropic.com/v1/models", True)),
        (
            "http://api.anthropic.com/v1/models",
            "api.anthropic.com",
            "GET",
            ("https://api.anthropic.com/v1/models", True),
        ),
        ("http://statsig.anthropic.com/x", "statsig.anthropic.com", "GET", ("https://statsig.anthropic.com/x", False)),
        ("/@evil.example/x", "127.0.0.1:4000", "GET", ("https://api.anthropic.com/@evil.example/x", True)),
    ],
)
def test_what_is_forwarded_goes_to_the_upstream_or_an_allowed_host(
    target: str, host: str, method: str, expected: tuple[str, bool]
) -> None:
    decided = route(target, host=host, method=method, allowed=("statsig.anthropic.com",))
    assert isinstance(decided, Route), decided
    assert (str(decided.url), decided.inject) == expected
    assert decided.url.host in ("api.anthropic.com", "statsig.anthropic.com")


@pytest.mark.parametrize(
    ("target", "host", "method", "reason"),
    [
        ("evil.example:443", "evil.example:443", "CONNECT", RefusalReason.CONNECT),
        ("api.anthropic.com:443", "api.anthropic.com:443", "CONNECT", RefusalReason.CONNECT),
        ("/v1/messages", "evil.example", "POST", RefusalReason.HOST),
        ("/v1/messages", "127.0.0.1:4001", "POST", RefusalReason.HOST),
        ("http://evil.example/steal", "evil.example", "GET", RefusalReason.HOST),
        ("https://evil.example/steal", "127.0.0.1:4000", "GET", RefusalReason.HOST),
        ("http://api.anthropic.com:8080/v1/models", "api.anthropic.com", "GET", RefusalReason.HOST),
        ("http://user:pw@api.anthropic.com/v1", "api.anthropic.com", "GET", RefusalReason.TARGET),
        ("ftp://api.anthropic.com/v1", "api.anthropic.com", "GET", RefusalReason.TARGET),
        ("*", "127.0.0.1:4000", "OPTIONS", RefusalReason.TARGET),
        ("//evil.example/x", "127.0.0.1:4000", "GET", RefusalReason.PATH_SUSPICIOUS),
    ],
)
def test_everything_else_is_refused(target: str, host: str, method: str, reason: RefusalReason) -> None:
    decided = route(target, host=host, method=method)
    assert isinstance(decided, Refusal) and decided.reason is reason


def test_without_an_upstream_nothing_is_forwarded() -> None:
    decided = decide_egress_route(
        method="POST",
        target="/v1/messages",
        host_header="127.0.0.1:4000",
        own=OWN,
        upstream=None,
        allowed_hosts=frozenset(),
    )
    assert decided == Refusal(RefusalReason.NO_UPSTREAM)


def test_only_auth_headers_carrying_the_placeholder_get_the_credential() -> None:
    incoming = [
        (b"Host", b"127.0.0.1:4000"),
        (b"x-api-key", PLACEHOLDER.encode()),
        (b"Authorization", f"Bearer {PLACEHOLDER}".encode()),
        (b"x-goog-api-key", b"something-the-agent-made-up"),
        (b"Proxy-Authorization", b"Basic abc"),
        (b"Connection", b"keep-alive"),
        (b"anthropic-version", b"2023-06-01"),
    ]
    out = dict(build_upstream_headers(incoming, inject=True, credential="REAL"))
    assert out == {b"x-api-key": b"REAL", b"authorization": b"Bearer REAL", b"anthropic-version": b"2023-06-01"}
    # To an allowed host that is not the provider's, no auth header at all.
    assert dict(build_upstream_headers(incoming, inject=False, credential="REAL")) == {
        b"anthropic-version": b"2023-06-01"
    }


def test_the_agent_environment_names_the_proxy_for_each_provider() -> None:
    from helmhive.runner.egress.proxy import EgressEndpoint

    endpoint = EgressEndpoint(port=4000)
    anthropic = build_proxy_env(provider="anthropic", credential_env_name="ANTHROPIC_API_KEY", endpoint=endpoint)
    assert anthropic == {
        "HELMHIVE_PROVIDER_BASE_URL": "http://127.0.0.1:4000",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:4000",
        "ANTHROPIC_API_KEY": PLACEHOLDER,
    }
    openai = build_proxy_env(provider="openai", credential_env_name="OPENAI_API_KEY", endpoint=endpoint)
    assert openai["OPENAI_BASE_URL"] == "http://127.0.0.1:4000/v1"
    assert openai["OPENAI_API_KEY"] == PLACEHOLDER
    # A subscription's long-lived token is sent as a bearer token; only the pool's variable holds the placeholder.
    oauth = build_proxy_env(provider="anthropic", credential_env_name="CLAUDE_CODE_OAUTH_TOKEN", endpoint=endpoint)
    assert oauth["CLAUDE_CODE_OAUTH_TOKEN"] == PLACEHOLDER and "ANTHROPIC_API_KEY" not in oauth
    google = build_proxy_env(provider="google", credential_env_name="GEMINI_API_KEY", endpoint=endpoint)
    assert google["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:4000"


# -- the proxy, over real sockets -------------------------------------------------------------------


def _count(outcome: str) -> float:
    return REGISTRY.get_sample_value("helmhive_runner_egress_requests_total", {"outcome": outcome}) or 0.0


@pytest.fixture
async def provider_and_proxy(tmp_path: Path) -> AsyncIterator[tuple[FakeProvider, EgressProxy, str]]:
    with fake_provider(tmp_path / "pki", canary=CANARY) as provider:
        proxy = EgressProxy(upstream=provider.url, credential=lambda: SecretStr(CANARY), ca_bundle=provider.ca_file)
        endpoint = await proxy.start()
        try:
            yield provider, proxy, endpoint.base_url
        finally:
            await proxy.close()


async def test_the_provider_gets_the_real_key_and_the_response_streams(
    provider_and_proxy: tuple[FakeProvider, EgressProxy, str],
) -> None:
    provider, _, base = provider_and_proxy
    forwarded = _count("forwarded")
    async with httpx.AsyncClient(base_url=base, trust_env=False) as client:
        models = await client.get("/v1/models", params={"key": PLACEHOLDER}, headers={"x-goog-api-key": PLACEHOLDER})
        assert models.status_code == 200 and models.json() == {"ok": True}
        headers = {"x-api-key": PLACEHOLDER, "authorization": f"Bearer {PLACEHOLDER}"}
        async with client.stream("POST", "/v1/messages", headers=headers, json={"stream": True}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            chunks = response.aiter_bytes()
            first = await asyncio.wait_for(anext(chunks), 20)
            # The provider holds its second event back until this point: the proxy streamed the first.
            assert b"message_start" in first and b"message_stop" not in first
            provider.release.set()
            rest = b"".join([chunk async for chunk in chunks])
            assert b"message_stop" in rest
    assert [(r.method, r.path, r.auth) for r in provider.requests] == [
        ("GET", "/v1/models", {"x-goog-api-key": "canary", "query:key": "canary"}),
        ("POST", "/v1/messages", {"authorization": "canary", "x-api-key": "canary"}),
    ]
    assert all(r.host == provider.url.removeprefix("https://") for r in provider.requests)
    assert _count("forwarded") == forwarded + 2


async def _raw(base: str, request: bytes) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 20)
    writer.close()
    return data


async def test_tunnels_and_other_hosts_are_refused_and_counted(
    provider_and_proxy: tuple[FakeProvider, EgressProxy, str],
) -> None:
    provider, _, base = provider_and_proxy
    before = {r: _count(f"refused-{r}") for r in ("connect", "host")}
    connect = await _raw(base, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    absolute = await _raw(base, b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n")
    other_host = await _raw(base, b"GET /v1/models HTTP/1.1\r\nHost: example.com\r\n\r\n")
    for answer in (connect, absolute, other_host):
        assert answer.startswith(b"HTTP/1.1 403 "), answer[:80]
    assert _count("refused-connect") == before["connect"] + 1
    assert _count("refused-host") == before["host"] + 2
    assert provider.requests == []  # nothing reached the provider


async def test_an_upstream_whose_certificate_is_not_trusted_is_not_reached(tmp_path: Path) -> None:
    other_ca, _ = write_ca_pair(tmp_path / "other", name="other")
    with fake_provider(tmp_path / "pki", canary=CANARY) as provider:
        proxy = EgressProxy(upstream=provider.url, credential=lambda: SecretStr(CANARY), ca_bundle=other_ca)
        endpoint = await proxy.start()
        failed = _count("upstream-failed")
        try:
            async with httpx.AsyncClient(base_url=endpoint.base_url, trust_env=False) as client:
                answer = await client.get("/v1/models", headers={"x-api-key": PLACEHOLDER})
        finally:
            await proxy.close()
    assert answer.status_code == 502 and "ConnectError" in answer.text
    assert _count("upstream-failed") == failed + 1
    assert provider.requests == []  # the TLS handshake failed before any request


async def test_a_wiped_credential_is_never_replaced_by_anything(tmp_path: Path) -> None:
    with fake_provider(tmp_path / "pki", canary=CANARY) as provider:
        proxy = EgressProxy(upstream=provider.url, credential=lambda: None, ca_bundle=provider.ca_file)
        endpoint = await proxy.start()
        try:
            async with httpx.AsyncClient(base_url=endpoint.base_url, trust_env=False) as client:
                answer = await client.get("/v1/models", headers={"x-api-key": PLACEHOLDER})
        finally:
            await proxy.close()
    assert answer.status_code == 503 and "no-credential" in answer.text
    assert provider.requests == []


async def test_the_proxy_listens_on_loopback_only(provider_and_proxy: tuple[FakeProvider, EgressProxy, str]) -> None:
    _, proxy, base = provider_and_proxy
    assert proxy.endpoint is not None and base == f"http://127.0.0.1:{proxy.endpoint.port}"
    addresses = {s.getsockname()[0] for s in proxy._server.sockets} if proxy._server else set()
    assert addresses == {"127.0.0.1"}
    with socket.socket() as probe:
        probe.settimeout(2)
        probe.connect(("127.0.0.1", proxy.endpoint.port))  # reachable where the agent is
