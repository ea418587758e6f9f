"""The operator's JSON requests on the event loop (:mod:`helmhive.controller.kube_http`): TLS from the
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

import pytest
from kubernetes import client

from helmhive.api.kubeerrors import Unavailable
from helmhive.controller.kube import Kube
from helmhive.controller.kube_http import LoopHttp, build_ssl_context
from helmhive.kubeclient import credential_refresh_due, throttle_credential_refresh


def _configuration(**settings: Any) -> client.Configuration:
    configuration = client.Configuration(host="https://127.0.0.1:6443")
    for name, value in settings.items():
        setattr(configuration, name, value)
    return configuration


def test_tls_follows_the_clients_configuration() -> None:
    assert build_ssl_context(_configuration(verify_ssl=False)) is False
    checked = build_ssl_context(_configuration())
    assert isinstance(checked, ssl.SSLContext)
    assert checked.verify_mode is ssl.CERT_REQUIRED and checked.check_hostname
    unnamed = build_ssl_context(_configuration(assert_hostname=False))
    assert isinstance(unnamed, ssl.SSLContext) and not unnamed.check_hostname
    assert unnamed.verify_mode is ssl.CERT_REQUIRED, "the certificate is still checked, only not its name"


def test_a_missing_ca_file_is_an_error_not_an_unchecked_connection(tmp_path: Any) -> None:
    with pytest.raises(FileNotFoundError):
        build_ssl_context(_configuration(ssl_ca_cert=str(tmp_path / "absent.crt")))


def test_a_proxy_or_an_executor_keeps_the_threaded_path() -> None:
    assert Kube(client.ApiClient(_configuration()))._http is not None
    assert Kube(client.ApiClient(_configuration(proxy="http://proxy.example:3128")))._http is None
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
