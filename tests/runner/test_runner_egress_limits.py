"""The egress proxy's bounds on one job: the provider's paths, a request rate, requests in flight.

The decisions are pure (a fake clock drives the token bucket); then a real proxy in front of the
fake TLS provider refuses, names and counts each kind, per job listener (a UNIX socket, as a job's
network-namespace relay reaches it, and a TCP port), while another job's listener is untouched.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from helmhive.api.egress import EgressSpec, decide_allowed_paths
from helmhive.runner.egress.limits import (
    Admission,
    JobLimiter,
    LimitRefusal,
    PathRefusal,
    RequestLimits,
    TokenBucket,
    decide_path,
)
from helmhive.runner.egress.proxy import (
    PLACEHOLDER,
    EgressProxy,
    RefusalReason,
    build_request_limits,
    decide_egress_route,
)
from helmhive.runner.metrics import REGISTRY
from helmhive.runner.sandbox.netns import short_unix_path

from .fake_provider import FakeProvider, fake_provider

CANARY = "sk-ant-limits-canary-7f3a"
ANTHROPIC = decide_allowed_paths(provider="anthropic", egress=EgressSpec())


# -- pure ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "refused"),
    [
        ("/v1/messages", None),
        ("/v1/messages?beta=true", None),
        ("/v1/messages/count_tokens", None),
        ("/v1/models/claude-sonnet-4-5", None),
        ("/v1/messagesX", PathRefusal.NOT_ALLOWED),
        ("/v1/organizations/api_keys", PathRefusal.NOT_ALLOWED),
        ("/", PathRefusal.NOT_ALLOWED),
        ("/v1/messages/../organizations", PathRefusal.SUSPICIOUS),
        ("/v1/messages/%2e%2e/organizations", PathRefusal.SUSPICIOUS),
        ("/v1/messages%2F..%2Forganizations", PathRefusal.SUSPICIOUS),
        ("/v1//messages", PathRefusal.SUSPICIOUS),
        ("/v1/./messages", PathRefusal.SUSPICIOUS),
        ("/v1/messages\\..", PathRefusal.SUSPICIOUS),
    ],
)
def test_only_the_providers_api_paths_are_allowed(target: str, refused: PathRefusal | None) -> None:
    assert decide_path(target=target, allowed=ANTHROPIC) is refused


def test_path_defaults_per_provider_and_the_pools_own() -> None:
    assert "/v1/responses" in decide_allowed_paths(provider="openai", egress=EgressSpec())
    assert "/v1beta/models" in decide_allowed_paths(provider="google", egress=EgressSpec())
    assert decide_allowed_paths(provider="my-gateway", egress=EgressSpec()) == ("/",)  # the pool names the upstream
    pinned = EgressSpec.model_validate({"allowedPaths": ["/v1/messages"]})
    assert decide_allowed_paths(provider="anthropic", egress=pinned) == ("/v1/messages",)
    assert decide_path(target="/v1/models", allowed=decide_allowed_paths(provider="x", egress=pinned)) is not None
    with pytest.raises(ValidationError) as bad:
        EgressSpec.model_validate({"allowedPaths": ["/v1/../admin", "v1"], "requestsPerMinute": 0})
    where = {tuple(e["loc"]) for e in bad.value.errors()}
    assert where == {("allowedPaths", 0), ("allowedPaths", 1), ("requestsPerMinute",)}


def test_a_refused_path_is_never_routed_to_the_upstream() -> None:
    decided = decide_egress_route(
        method="POST",
        target="/v1/organizations/api_keys",
        host_header="127.0.0.1:4000",
        own=frozenset({"127.0.0.1:4000"}),
        upstream=httpx.URL("https://api.anthropic.com"),
        allowed_hosts=frozenset(),
        allowed_paths=ANTHROPIC,
    )
    assert getattr(decided, "reason", None) is RefusalReason.PATH


def test_the_token_bucket_refills_at_the_rate_and_holds_at_most_the_burst() -> None:
    bucket = TokenBucket(rate=2.0, capacity=3.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.4) is False  # 0.8 of a token
    assert bucket.take(0.5) is True  # 1.0
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]  # never more than the burst
    assert bucket.take(99.0) is False  # a clock that steps back refills nothing


def test_the_limiter_counts_in_flight_and_refuses_without_taking_a_token() -> None:
    now = [0.0]
    limiter = JobLimiter(RequestLimits(requests_per_minute=60, burst=2, max_concurrent=1), clock=lambda: now[0])
    first = limiter.admit()
    assert isinstance(first, Admission)
    assert limiter.admit() is LimitRefusal.CONCURRENCY
    first.release()
    second = limiter.admit()
    assert isinstance(second, Admission)
    second.release()
    assert limiter.admit() is LimitRefusal.RATE  # the burst of 2 is spent
    now[0] = 1.0  # one token per second
    assert isinstance(limiter.admit(), Admission)


# -- a real proxy ------------------------------------------------------------------------------------


def _count(outcome: str) -> float:
    return REGISTRY.get_sample_value("helmhive_runner_egress_requests_total", {"outcome": outcome}) or 0.0


@pytest.fixture
async def limited(tmp_path: Path) -> AsyncIterator[tuple[FakeProvider, EgressProxy]]:
    spec = EgressSpec.model_validate({"requestsPerMinute": 60, "burst": 3, "maxConcurrentRequests": 1})
    with fake_provider(tmp_path / "pki", canary=CANARY) as provider:
        proxy = EgressProxy(
            upstream=provider.url,
            credential=lambda: SecretStr(CANARY),
            ca_bundle=provider.ca_file,
            allowed_paths=ANTHROPIC,
            limits=build_request_limits(spec),
        )
        await proxy.start()
        try:
            yield provider, proxy
        finally:
            await proxy.close()


HEADERS = {"x-api-key": PLACEHOLDER}


async def test_each_job_listener_has_its_own_limits_and_refusals_are_named_and_counted(
    limited: tuple[FakeProvider, EgressProxy], tmp_path: Path
) -> None:
    provider, proxy = limited
    socket_path = tmp_path / ("a-long-directory-name-" * 4) / "job.sock"  # past sockaddr_un's 107 bytes
    socket_path.parent.mkdir(parents=True)
    job_a = await proxy.open_job(socket_path=socket_path)
    job_a.authorize(lambda pid: pid == os.getpid())  # this test plays job_a's relay
    job_b = await proxy.open_job()
    assert job_a.socket == socket_path and socket_path.exists() and job_b.socket is None
    assert job_b.port != job_a.port  # job_a's agent names the runner's port, inside its namespace
    before = {r: _count(f"refused-{r}") for r in ("path", "rate", "concurrency")}
    with short_unix_path(str(socket_path)) as uds:  # as the relay reaches it
        a = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{job_a.port}", transport=httpx.AsyncHTTPTransport(uds=uds), trust_env=False
        )
        b = httpx.AsyncClient(base_url=f"http://127.0.0.1:{job_b.port}", trust_env=False)
        await _exercise(provider, a, b)
        await a.aclose()
        await b.aclose()
    await job_a.close()
    await job_b.close()
    assert not socket_path.exists()
    assert _count("refused-path") == before["path"] + 1
    assert _count("refused-concurrency") == before["concurrency"] + 1
    assert _count("refused-rate") == before["rate"] + 1
    assert {(r.method, r.path) for r in provider.requests} == {("POST", "/v1/messages"), ("GET", "/v1/models")}
    assert all(r.auth == {"x-api-key": "canary"} for r in provider.requests)
    with pytest.raises(httpx.ConnectError):  # a closed job listener takes nothing more
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{job_b.port}", trust_env=False) as late:
            await asyncio.wait_for(late.get("/v1/models"), 10)


async def _exercise(provider: FakeProvider, a: httpx.AsyncClient, b: httpx.AsyncClient) -> None:
    """Job a meets each bound; job b, on its own listener, is never held up by a's use."""
    path = await a.post("/v1/organizations/api_keys", headers=HEADERS, json={})
    assert (path.status_code, path.text) == (403, "helmhive egress proxy: refused (path)\n")
    # One request in flight at a time: the provider holds its stream until released.
    async with a.stream("POST", "/v1/messages", headers=HEADERS, json={"stream": True}) as held:
        assert held.status_code == 200
        busy = await a.post("/v1/messages", headers=HEADERS, json={})
        assert (busy.status_code, busy.text) == (429, "helmhive egress proxy: refused (concurrency)\n")
        other = await b.get("/v1/models", headers=HEADERS)  # another job is not held up by this one
        assert other.status_code == 200
        provider.release.set()
        assert b"message_stop" in b"".join([chunk async for chunk in held.aiter_bytes()])
    # The burst (3) is spent by now: the stream and two more; then the rate refuses.
    statuses = [(await a.get("/v1/models", headers=HEADERS)).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert (await b.get("/v1/models", headers=HEADERS)).status_code == 200  # job b has its own bucket
