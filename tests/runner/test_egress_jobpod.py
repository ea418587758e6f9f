"""The egress proxy's job pods' listener: a job's phantom key, from its pod's address only.

The decision (:func:`decide_pod_request`) is pure and tried case by case; then a real proxy's job
pods' listener on loopback, in front of the fake TLS provider (:mod:`.fake_provider`, which only
records whether an auth header held the canary credential, the placeholder or something else).
A job pod's address is a loopback address: Linux routes all of 127/8 to ``lo``, so a client bound
to 127.0.0.2 is "another pod" to the proxy, whose listener sees the client's source address as
its peer, just as the runner pod sees a job pod's IP through the shim's relay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from helmhive.api.egress import EgressSpec, decide_allowed_paths
from helmhive.api.jobpod import EGRESS_RELAY_PORT
from helmhive.runner.egress.limits import JobLimiter, RequestLimits
from helmhive.runner.egress.listeners import own_authorities
from helmhive.runner.egress.pods import (
    PHANTOM_PREFIX,
    PodJob,
    decide_pod_request,
    key_digest,
    mint_phantom_key,
    parse_ip,
)
from helmhive.runner.egress.proxy import (
    PLACEHOLDER,
    EgressEndpoint,
    EgressProxy,
    PodJobEgress,
    Refusal,
    RefusalReason,
    Route,
    build_pod_proxy_env,
    build_proxy_env,
    decide_egress_route,
)
from helmhive.runner.metrics import REGISTRY

from .fake_provider import FakeProvider, fake_provider

CANARY = "sk-jobpod-canary-5d1e9a7c3b20f4e6"
ANTHROPIC = decide_allowed_paths(provider="anthropic", egress=EgressSpec())
GENEROUS = RequestLimits(requests_per_minute=600, burst=100, max_concurrent=8)
HERE = "127.0.0.1"
"""The job pod's address (a client's default source address on loopback)."""
ELSEWHERE = "127.0.0.2"
"""Another pod's."""
OTHER_POD = "127.0.0.3"
"""A second job's pod."""
TIMEOUT = 30.0
Pods = tuple[FakeProvider, EgressProxy, int]
"""The fake provider, the proxy, and its job pods' listener's port."""


def _count(outcome: str) -> float:
    return REGISTRY.get_sample_value("helmhive_runner_egress_requests_total", {"outcome": outcome}) or 0.0


def _refused(reason: str) -> str:
    return f"helmhive egress proxy: refused ({reason})\n"


# -- pure ------------------------------------------------------------------------------------------


def test_a_phantom_key_is_recognisable_random_and_kept_out_of_reprs() -> None:
    keys = {mint_phantom_key().get_secret_value() for _ in range(64)}
    assert len(keys) == 64
    for key in keys:
        assert key.startswith(PHANTOM_PREFIX) and len(key) >= len(PHANTOM_PREFIX) + 43  # 32 bytes, base64
        assert key != PLACEHOLDER and PLACEHOLDER not in key
    secret = mint_phantom_key()
    assert secret.get_secret_value() not in repr(secret) + str(secret)


def _job(name: str, pod_ip: str, *, revoked: bool = False) -> PodJob:
    limiter = JobLimiter(GENEROUS, clock=lambda: 0.0)
    address = parse_ip(pod_ip)
    assert address is not None
    return PodJob(job=name, pod_ip=address, key=mint_phantom_key(), limiter=limiter, revoked=revoked)


ALPHA = _job("alpha", "10.0.0.5")
BETA = _job("beta", "10.0.0.6", revoked=True)
TABLE = {key_digest(j.key.get_secret_value()): j for j in (ALPHA, BETA)}
A_KEY = ALPHA.key.get_secret_value()
B_KEY = BETA.key.get_secret_value()


@pytest.mark.parametrize(
    ("headers", "query", "peer", "expected"),
    [
        ([(b"x-api-key", A_KEY)], "", "10.0.0.5", "alpha"),
        ([(b"Authorization", f"Bearer {A_KEY}")], "", "10.0.0.5", "alpha"),
        ([(b"x-goog-api-key", A_KEY), (b"api-key", A_KEY)], "", "10.0.0.5", "alpha"),
        ([], f"alt=sse&key={A_KEY}", "10.0.0.5", "alpha"),
        ([(b"x-api-key", A_KEY)], "", "::ffff:10.0.0.5", "alpha"),  # a dual-stack listener's peer
        ([], "", "10.0.0.5", RefusalReason.KEY),
        ([(b"x-api-key", PLACEHOLDER)], f"key={PLACEHOLDER}", "10.0.0.5", RefusalReason.KEY),
        ([(b"x-api-key", mint_phantom_key().get_secret_value())], "", "10.0.0.5", RefusalReason.KEY),
        ([(b"x-custom", A_KEY)], "", "10.0.0.5", RefusalReason.KEY),  # not where a key is taken
        ([], f"other={A_KEY}", "10.0.0.5", RefusalReason.KEY),
        ([(b"x-api-key", A_KEY + "x")], "", "10.0.0.5", RefusalReason.KEY),  # not the whole key
        ([(b"x-api-key", A_KEY[:-1])], "", "10.0.0.5", RefusalReason.KEY),
        ([(b"x-api-key", A_KEY), (b"authorization", f"Bearer {B_KEY}")], "", "10.0.0.5", RefusalReason.KEY),
        ([(b"x-api-key", A_KEY)], "", "10.0.0.6", RefusalReason.PEER),
        ([(b"x-api-key", A_KEY)], "", None, RefusalReason.PEER),
        ([(b"x-api-key", B_KEY)], "", "10.0.0.6", RefusalReason.REVOKED),
        ([(b"x-api-key", B_KEY)], "", "10.0.0.5", RefusalReason.PEER),  # a replay is named as one
    ],
    # Named ids: the keys are random, so ids built from them differ between
    # xdist workers, and a key must not appear in test output anyway.
    ids=[
        "x-api-key",
        "bearer",
        "two-headers-same-key",
        "query-key",
        "mapped-ipv6-peer",
        "no-key",
        "placeholder",
        "unknown-key",
        "unread-header",
        "unread-query-param",
        "key-with-suffix",
        "key-truncated",
        "two-different-keys",
        "wrong-peer",
        "no-peer",
        "revoked",
        "revoked-replay-from-other-peer",
    ],
)
def test_whose_request_it_is(
    headers: list[tuple[bytes, str]], query: str, peer: str | None, expected: str | RefusalReason
) -> None:
    decided = decide_pod_request(
        headers=[(name, value.encode("latin-1")) for name, value in headers],
        query=query,
        peer=parse_ip(peer),
        jobs=TABLE,
    )
    if isinstance(expected, RefusalReason):
        assert isinstance(decided, Refusal) and decided.reason is expected, decided
        assert A_KEY not in repr(decided) and B_KEY not in repr(decided)
    else:
        assert isinstance(decided, PodJob) and decided.job == expected


def test_a_pod_jobs_agent_is_told_the_relay_and_its_phantom_key() -> None:
    key = mint_phantom_key()
    relay = f"http://127.0.0.1:{EGRESS_RELAY_PORT}"
    anthropic = build_pod_proxy_env(provider="anthropic", credential_env_name="ANTHROPIC_API_KEY", key=key)
    assert anthropic == {
        "HELMHIVE_PROVIDER_BASE_URL": relay,
        "ANTHROPIC_BASE_URL": relay,
        "ANTHROPIC_API_KEY": key.get_secret_value(),
    }
    openai = build_pod_proxy_env(provider="openai", credential_env_name="OPENAI_API_KEY", key=key, relay_port=9000)
    assert openai["OPENAI_BASE_URL"] == "http://127.0.0.1:9000/v1"
    assert openai["OPENAI_API_KEY"] == key.get_secret_value() and PLACEHOLDER not in openai.values()
    # The general form: any host and port, and the key; without a key, the placeholder as before.
    pod = EgressEndpoint(port=7471, host="10.1.2.3")
    env = build_proxy_env(provider="google", credential_env_name="GEMINI_API_KEY", endpoint=pod, key=key)
    assert env["GOOGLE_GEMINI_BASE_URL"] == "http://10.1.2.3:7471" and env["GEMINI_API_KEY"] == key.get_secret_value()
    assert EgressEndpoint(port=7471, host="fd00::5").base_url == "http://[fd00::5]:7471"
    plain = build_proxy_env(
        provider="anthropic", credential_env_name="ANTHROPIC_API_KEY", endpoint=EgressEndpoint(4000)
    )
    assert plain["ANTHROPIC_API_KEY"] == PLACEHOLDER and plain["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:4000"


def test_the_relay_and_the_runner_pods_address_name_the_proxy() -> None:
    own = own_authorities(EGRESS_RELAY_PORT, also=["10.1.2.3:7471"])
    upstream = httpx.URL("https://api.anthropic.com")
    for host in (f"127.0.0.1:{EGRESS_RELAY_PORT}", f"localhost:{EGRESS_RELAY_PORT}", "10.1.2.3:7471"):
        decided = decide_egress_route(
            method="POST",
            target="/v1/messages",
            host_header=host,
            own=own,
            upstream=upstream,
            allowed_hosts=frozenset(),
        )
        assert isinstance(decided, Route) and decided.inject, host
    stranger = decide_egress_route(
        method="POST", target="/v1/messages", host_header="10.1.2.4:7471", own=own, upstream=upstream,
        allowed_hosts=frozenset(),
    )  # fmt: skip
    assert isinstance(stranger, Refusal) and stranger.reason is RefusalReason.HOST


# -- a real proxy ------------------------------------------------------------------------------------


@pytest.fixture
async def pods(tmp_path: Path) -> AsyncIterator[Pods]:
    with fake_provider(tmp_path / "pki", canary=CANARY) as provider:
        proxy = EgressProxy(
            upstream=provider.url,
            credential=lambda: SecretStr(CANARY),
            ca_bundle=provider.ca_file,
            allowed_paths=ANTHROPIC,
            clock=lambda: 0.0,  # no token comes back during a test: the rate is the burst
        )
        endpoint = await proxy.start_pod_listener(host=HERE, port=0)
        assert endpoint.port != 0
        try:
            yield provider, proxy, endpoint.port
        finally:
            await proxy.close()


def _client(port: int, source: str = HERE) -> httpx.AsyncClient:
    """A job pod's agent, as its requests reach the runner: from its pod's address."""
    return httpx.AsyncClient(
        base_url=f"http://{HERE}:{port}",
        transport=httpx.AsyncHTTPTransport(local_address=source),
        trust_env=False,
        timeout=TIMEOUT,
    )


def _key(job: PodJobEgress) -> str:
    return job.key.get_secret_value()


async def _drain(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


async def test_a_jobs_key_from_its_pod_reaches_the_provider_as_the_credential(pods: Pods) -> None:
    provider, proxy, port = pods
    job = proxy.open_pod_job(job="alpha", pod_ip=HERE, limits=GENEROUS)
    key = _key(job)
    forwarded = _count("forwarded")
    async with _client(port) as agent:
        models = await agent.get("/v1/models", headers={"x-api-key": key})
        assert models.status_code == 200 and models.json() == {"ok": True}
        # As the agent's requests arrive through the shim: naming the relay on the pod's loopback.
        relayed = await agent.get(
            "/v1/models", headers={"host": f"127.0.0.1:{EGRESS_RELAY_PORT}", "authorization": f"Bearer {key}"}
        )
        assert relayed.status_code == 200
        # Gemini's way: the key in the query (and its header); a placeholder beside it is dropped.
        gemini = await agent.get(
            "/v1/models", params={"key": key}, headers={"x-goog-api-key": key, "api-key": PLACEHOLDER}
        )
        assert gemini.status_code == 200
        async with agent.stream("POST", "/v1/messages", headers={"x-api-key": key}, json={"stream": True}) as stream:
            assert stream.status_code == 200 and stream.headers["content-type"] == "text/event-stream"
            chunks = stream.aiter_bytes()
            first = await asyncio.wait_for(anext(chunks), TIMEOUT)
            assert b"message_start" in first and b"message_stop" not in first  # streamed, not buffered
            provider.release.set()
            assert b"message_stop" in await asyncio.wait_for(_drain(chunks), TIMEOUT)
    assert [(r.method, r.path, r.auth) for r in provider.requests] == [
        ("GET", "/v1/models", {"x-api-key": "canary"}),
        ("GET", "/v1/models", {"authorization": "canary"}),
        ("GET", "/v1/models", {"x-goog-api-key": "canary", "query:key": "canary"}),
        ("POST", "/v1/messages", {"x-api-key": "canary"}),
    ]
    assert all(r.host == provider.url.removeprefix("https://") for r in provider.requests)
    assert _count("forwarded") == forwarded + 4
    await job.close()


async def test_every_other_rule_still_applies_to_a_known_jobs_request(pods: Pods) -> None:
    provider, proxy, port = pods
    key = _key(proxy.open_pod_job(job="alpha", pod_ip=HERE, limits=GENEROUS))
    before = {r: _count(f"refused-{r}") for r in ("path", "host", "connect")}
    async with _client(port) as agent:
        path = await agent.post("/v1/organizations/api_keys", headers={"x-api-key": key}, json={})
        assert (path.status_code, path.text) == (403, _refused("path"))
        host = await agent.get("/v1/models", headers={"x-api-key": key, "host": "evil.example"})
        assert (host.status_code, host.text) == (403, _refused("host"))
    connect = await _raw(
        port, f"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\nx-api-key: {key}\r\n\r\n"
    )
    assert connect.startswith(b"HTTP/1.1 403 ") and connect.endswith(_refused("connect").encode())
    assert {r: _count(f"refused-{r}") - n for r, n in before.items()} == {"path": 1, "host": 1, "connect": 1}
    assert provider.requests == []


async def test_a_key_from_another_address_is_refused_peer(pods: Pods) -> None:
    provider, proxy, port = pods
    key = _key(proxy.open_pod_job(job="alpha", pod_ip=HERE, limits=GENEROUS))
    refused = _count("refused-peer")
    async with _client(port, source=ELSEWHERE) as replay:
        for headers, params in (({"x-api-key": key}, {}), ({}, {"key": key})):
            answer = await replay.get("/v1/models", headers=headers, params=params)
            assert (answer.status_code, answer.text) == (403, _refused("peer"))
    assert provider.requests == [] and _count("refused-peer") == refused + 2
    async with _client(port) as agent:  # the replays took nothing from the job itself
        assert (await agent.get("/v1/models", headers={"x-api-key": key})).status_code == 200
    assert [r.auth for r in provider.requests] == [{"x-api-key": "canary"}]


async def test_no_key_an_unknown_key_and_the_placeholder_are_refused_key(pods: Pods) -> None:
    provider, proxy, port = pods
    proxy.open_pod_job(job="alpha", pod_ip=HERE, limits=GENEROUS)
    closed = proxy.open_pod_job(job="gone", pod_ip=OTHER_POD, limits=GENEROUS)
    await closed.close()
    refused = _count("refused-key")
    attempts: list[tuple[dict[str, str], dict[str, str]]] = [
        ({}, {}),
        ({"x-api-key": PLACEHOLDER, "authorization": f"Bearer {PLACEHOLDER}"}, {}),
        ({}, {"key": PLACEHOLDER}),
        ({"x-api-key": mint_phantom_key().get_secret_value()}, {}),
        ({"x-api-key": _key(closed)}, {}),  # a closed job's key is forgotten
    ]
    async with _client(port) as agent:
        for headers, params in attempts:
            answer = await agent.get("/v1/models", headers=headers, params=params)
            assert (answer.status_code, answer.text) == (403, _refused("key")), headers
    async with _client(port, source=OTHER_POD) as gone:
        answer = await gone.get("/v1/models", headers={"x-api-key": _key(closed)})
        assert (answer.status_code, answer.text) == (403, _refused("key"))
    assert provider.requests == [] and _count("refused-key") == refused + len(attempts) + 1


async def test_revocation_refuses_at_once_cuts_open_streams_and_spares_other_jobs(pods: Pods) -> None:
    provider, proxy, port = pods
    alpha = proxy.open_pod_job(job="alpha", pod_ip=HERE, limits=GENEROUS)
    beta = proxy.open_pod_job(job="beta", pod_ip=OTHER_POD, limits=GENEROUS)
    a_key, b_key = _key(alpha), _key(beta)
    # An idle kept-alive connection of alpha's, which has served a request...
    reader, writer = await asyncio.open_connection(HERE, port, local_addr=(HERE, 0))
    writer.write(f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nx-api-key: {a_key}\r\n\r\n".encode())
    served = b""
    while b'{"ok":true}' not in served:
        chunk = await asyncio.wait_for(reader.read(4096), TIMEOUT)
        assert chunk, served
        served += chunk
    revoked = _count("refused-revoked")
    async with _client(port) as a, _client(port, source=OTHER_POD) as b:
        # ...and a stream in flight: the provider holds its second part back.
        async with a.stream("POST", "/v1/messages", headers={"x-api-key": a_key}, json={"stream": True}) as held:
            assert held.status_code == 200
            chunks = held.aiter_bytes()
            assert b"message_start" in await asyncio.wait_for(anext(chunks), TIMEOUT)
            alpha.revoke()
            assert alpha.revoked and not beta.revoked
            with pytest.raises(httpx.TransportError):  # cut, not left waiting for the provider
                await asyncio.wait_for(_drain(chunks), TIMEOUT)
        try:
            rest = await asyncio.wait_for(reader.read(), TIMEOUT)
        except ConnectionResetError:
            rest = b""
        assert rest == b""  # the idle connection was cut too
        for _ in range(2):
            answer = await a.get("/v1/models", headers={"x-api-key": a_key})
            assert (answer.status_code, answer.text) == (403, _refused("revoked"))
        other = await b.get("/v1/models", headers={"x-api-key": b_key})
        assert other.status_code == 200  # another job's key is untouched
        # Alpha's pod address is free for a new job once alpha is revoked.
        again = proxy.open_pod_job(job="alpha-2", pod_ip=HERE, limits=GENEROUS)
        assert (await a.get("/v1/models", headers={"x-api-key": _key(again)})).status_code == 200
        await alpha.close()
        forgotten = await a.get("/v1/models", headers={"x-api-key": a_key})
        assert (forgotten.status_code, forgotten.text) == (403, _refused("key"))
    writer.close()
    assert _count("refused-revoked") == revoked + 2
    assert [(r.path, r.auth) for r in provider.requests] == [
        ("/v1/models", {"x-api-key": "canary"}),
        ("/v1/messages", {"x-api-key": "canary"}),
        ("/v1/models", {"x-api-key": "canary"}),
        ("/v1/models", {"x-api-key": "canary"}),
    ]


async def test_limits_are_per_job(pods: Pods) -> None:
    provider, proxy, port = pods
    tight = RequestLimits(requests_per_minute=60, burst=2, max_concurrent=1)  # the clock stands still
    alpha = _key(proxy.open_pod_job(job="alpha", pod_ip=HERE, limits=tight))
    beta = _key(proxy.open_pod_job(job="beta", pod_ip=OTHER_POD, limits=tight))
    before = {r: _count(f"refused-{r}") for r in ("rate", "concurrency")}
    async with _client(port) as a, _client(port, source=OTHER_POD) as b:
        async with a.stream("POST", "/v1/messages", headers={"x-api-key": alpha}, json={"stream": True}) as held:
            assert held.status_code == 200
            busy = await a.get("/v1/models", headers={"x-api-key": alpha})
            assert (busy.status_code, busy.text) == (429, _refused("concurrency"))
            assert (await b.get("/v1/models", headers={"x-api-key": beta})).status_code == 200  # not held up
            provider.release.set()
            assert b"message_stop" in await asyncio.wait_for(_drain(held.aiter_bytes()), TIMEOUT)
        # Alpha's burst of 2: the stream and one more; then the rate. Beta has one left of its own.
        statuses = [(await a.get("/v1/models", headers={"x-api-key": alpha})).status_code for _ in range(2)]
        assert statuses == [200, 429]
        assert (await b.get("/v1/models", headers={"x-api-key": beta})).status_code == 200
        assert (await b.get("/v1/models", headers={"x-api-key": beta})).status_code == 429
    assert {r: _count(f"refused-{r}") - n for r, n in before.items()} == {"rate": 2, "concurrency": 1}


async def _raw(port: int, request: str, *, source: str = HERE) -> bytes:
    """One request on a connection of its own (no httpx on the client's side: every ``httpx`` log
    record is then the proxy's own upstream client's)."""
    reader, writer = await asyncio.open_connection(HERE, port, local_addr=(source, 0))
    writer.write(request.encode("ascii"))
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), TIMEOUT)
    finally:
        writer.close()


async def test_neither_a_phantom_key_nor_the_credential_is_logged_or_answered(
    pods: Pods, caplog: pytest.LogCaptureFixture
) -> None:
    provider, proxy, port = pods
    caplog.set_level(logging.DEBUG)
    alpha = proxy.open_pod_job(job="alpha", pod_ip=HERE, limits=GENEROUS)
    key = _key(alpha)
    stranger = mint_phantom_key().get_secret_value()
    assert key not in repr(alpha) and key not in str(alpha.key)

    def get(query: str = "", **headers: str) -> str:
        lines = [f"GET /v1/models{query} HTTP/1.1", f"Host: 127.0.0.1:{EGRESS_RELAY_PORT}", "Connection: close"]
        return "\r\n".join([*lines, *(f"{k}: {v}" for k, v in headers.items()), "", ""])

    answers = [
        await _raw(port, get(**{"x-api-key": key})),
        await _raw(port, get(f"?key={key}")),  # the credential goes into the upstream's URL
        await _raw(port, get(**{"x-api-key": key}), source=ELSEWHERE),
        await _raw(port, get(**{"x-api-key": stranger})),
    ]
    alpha.revoke()
    answers.append(await _raw(port, get(**{"authorization": f"Bearer {key}"})))
    assert [a.split(b" ", 2)[1] for a in answers] == [b"200", b"200", b"403", b"403", b"403"]
    assert [r.auth for r in provider.requests] == [{"x-api-key": "canary"}, {"query:key": "canary"}]
    for answer in answers:
        assert key.encode() not in answer and CANARY.encode() not in answer and stranger.encode() not in answer
    assert caplog.records, "nothing was logged"
    for record in caplog.records:
        seen = f"{record.getMessage()} {record.args!r} {record.__dict__!r}"
        assert key not in seen and CANARY not in seen and stranger not in seen, record.name
    # What is logged instead: the upstream's URL with the placeholder, and refusals by name.
    urls = [r.getMessage() for r in caplog.records if r.name == "httpx" and "HTTP Request" in r.getMessage()]
    assert len(urls) == 2 and f"key={PLACEHOLDER}" in urls[1], urls
    refusals = [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "egress: request refused"]
    assert [(f["reason"], f.get("job"), f.get("peer")) for f in refusals] == [
        ("peer", "alpha", ELSEWHERE),
        ("key", None, HERE),
        ("revoked", "alpha", HERE),
    ]


async def test_a_pod_job_needs_the_listener_an_address_and_an_address_of_its_own(tmp_path: Path) -> None:
    proxy = EgressProxy(upstream=None, credential=lambda: None)
    try:
        with pytest.raises(RuntimeError):
            proxy.open_pod_job(job="early", pod_ip=HERE, limits=GENEROUS)
        await proxy.start_pod_listener(host=HERE, port=0)
        with pytest.raises(RuntimeError):
            await proxy.start_pod_listener(host=HERE, port=0)
        with pytest.raises(ValueError):
            proxy.open_pod_job(job="bad", pod_ip="not-an-address", limits=GENEROUS)
        first = proxy.open_pod_job(job="first", pod_ip="10.0.0.7", limits=GENEROUS)
        with pytest.raises(ValueError):  # two live jobs behind one address could spend each other's keys
            proxy.open_pod_job(job="second", pod_ip="10.0.0.7", limits=GENEROUS)
        first.revoke()
        second = proxy.open_pod_job(job="second", pod_ip="10.0.0.7", limits=GENEROUS)
        assert _key(second) != _key(first) and second.pod_ip == "10.0.0.7"
    finally:
        await proxy.close()
    assert second.revoked  # closing the proxy revokes its pod jobs
