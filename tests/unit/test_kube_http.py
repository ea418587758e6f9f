"""The operator's JSON requests on the event loop (:mod:`helmhive.controller.kube.http`): TLS from the
client's configuration, one session per loop, and the network's silences as ``Unavailable``.

The requests themselves reach a real API server in ``tests/operator/test_kube_credentials.py`` and in
every cluster test that drives the operator's door.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes import client

from helmhive.api.kubeerrors import Unavailable
from helmhive.controller.kube.door import Kube
from helmhive.controller.kube.http import LoopHttp, build_ssl_context, decide_resend
from helmhive.kubeclient import credential_refresh_due, throttle_credential_refresh

_KEY = aiohttp.client_reqrep.ConnectionKey("127.0.0.1", 1, False, False, None, None, None)


def _configuration(**settings: Any) -> client.Configuration:
    configuration = client.Configuration(host="https://127.0.0.1:6443")
    for name, value in settings.items():
        setattr(configuration, name, value)
    return configuration


def test_tls_follows_the_clients_configuration(tmp_path: Any) -> None:
    unchecked = build_ssl_context(_configuration(verify_ssl=False))
    assert unchecked.verify_mode is ssl.CERT_NONE and not unchecked.check_hostname
    with pytest.raises(FileNotFoundError):  # the client certificate is still sent when nothing is checked
        build_ssl_context(_configuration(verify_ssl=False, cert_file=str(tmp_path / "absent.crt")))
    checked = build_ssl_context(_configuration())
    assert isinstance(checked, ssl.SSLContext)
    assert checked.verify_mode is ssl.CERT_REQUIRED and checked.check_hostname
    unnamed = build_ssl_context(_configuration(assert_hostname=False))
    assert isinstance(unnamed, ssl.SSLContext) and not unnamed.check_hostname
    assert unnamed.verify_mode is ssl.CERT_REQUIRED, "the certificate is still checked, only not its name"


def test_a_missing_ca_file_is_an_error_not_an_unchecked_connection(tmp_path: Any) -> None:
    with pytest.raises(FileNotFoundError):
        build_ssl_context(_configuration(ssl_ca_cert=str(tmp_path / "absent.crt")))


def test_a_proxy_a_named_host_or_an_executor_keeps_the_threaded_path() -> None:
    assert Kube(client.ApiClient(_configuration()))._http is not None
    assert Kube(client.ApiClient(_configuration(proxy="http://proxy.example:3128")))._http is None
    assert Kube(client.ApiClient(_configuration(assert_hostname="api.internal")))._http is None
    with ThreadPoolExecutor(1) as pool:
        assert Kube(client.ApiClient(_configuration()), executor=pool)._http is None


def _closed_port() -> int:
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_each_loop_gets_its_own_session_and_nothing_answering_is_unavailable() -> None:
    http = LoopHttp(_configuration(host=f"https://127.0.0.1:{_closed_port()}", verify_ssl=False), headers=dict)
    sessions: list[Any] = []

    async def once() -> None:
        with pytest.raises(Unavailable) as raised:
            await http.send("GET", "/version", headers={})
        assert raised.value.status == 0 and raised.value.__cause__ is not None
        sessions.append(http._session)
        await http.close()
        assert sessions[-1].closed

    asyncio.run(once())
    asyncio.run(once())
    assert sessions[0] is not sessions[1]


def test_a_due_credential_refresh_runs_off_the_loop_and_a_fresh_one_on_it() -> None:
    now = [100.0]
    threads: list[str] = []
    configuration = _configuration(host=f"https://127.0.0.1:{_closed_port()}", verify_ssl=False)

    def refresh(conf: Any) -> None:  # the kubeconfig loader's hook may read a file or run a plugin
        threads.append(threading.current_thread().name)
        conf.api_key = {"BearerToken": "Bearer canary-token-not-logged"}

    configuration.api_key = {"BearerToken": "Bearer canary-token-expired"}  # the client reads a set key only
    configuration.refresh_api_key_hook = refresh
    assert credential_refresh_due(configuration), "an unthrottled hook runs on every read"
    throttle_credential_refresh(configuration, monotonic=lambda: now[0])
    kube = Kube(client.ApiClient(configuration))
    assert kube._http is not None

    async def calls(count: int) -> None:
        for _ in range(count):
            with pytest.raises(Unavailable) as raised:
                await kube._http.send("GET", "/version", headers={})  # type: ignore[union-attr]
            assert "canary-token" not in raised.value.message
        await kube.close()

    assert credential_refresh_due(configuration)
    asyncio.run(calls(3))
    assert len(threads) == 1 and threads[0] != threading.main_thread().name, "run once, in a thread"
    assert not credential_refresh_due(configuration), "within its second the throttle holds"
    now[0] += 5
    asyncio.run(calls(1))
    assert len(threads) == 2 and threads[1] != threading.main_thread().name


def test_only_what_cannot_have_been_applied_is_sent_again() -> None:
    refused = aiohttp.ClientConnectorError(_KEY, OSError(111, "refused"))
    dropped = aiohttp.ServerDisconnectedError()
    for method in ("GET", "PUT", "PATCH", "POST", "DELETE"):
        assert decide_resend(method, refused), f"{method}: nothing was sent"
    assert decide_resend("GET", dropped)
    for method in ("PUT", "PATCH", "POST", "DELETE"):
        assert not decide_resend(method, dropped), f"{method}: the server may have applied it"
    assert not decide_resend("GET", TimeoutError())


def test_a_redirect_is_an_answer_not_followed() -> None:
    async def scenario() -> tuple[int, bytes, list[str]]:
        seen: list[str] = []

        async def moved(request: web.Request) -> web.Response:
            seen.append(request.path)
            raise web.HTTPFound("/elsewhere")

        async def elsewhere(request: web.Request) -> web.Response:
            seen.append(request.path)
            return web.json_response({"followed": True})

        app = web.Application()
        app.router.add_post("/apis/x", moved)
        app.router.add_get("/elsewhere", elsewhere)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        http = LoopHttp(client.Configuration(host=f"http://127.0.0.1:{port}"), headers=dict)
        try:
            status, body, _ = await http.send("POST", "/apis/x", b"{}", headers={"Content-Type": "application/json"})
        finally:
            await http.close()
            await runner.cleanup()
        return status, body, seen

    status, _, seen = asyncio.run(scenario())
    assert status == 302
    assert seen == ["/apis/x"], "the redirect was not followed (a POST would have become a GET)"
