"""One error tree for every door: the API server's answers and the network's silences map the same way."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.aio import run_closing
from helmhive.api.kinds import kind_by_name
from helmhive.api.kubeerrors import (
    MAX_MESSAGE,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    Unavailable,
    build_kube_error,
)
from helmhive.cli.kubeapi import CliKube
from helmhive.controller.kube.door import Kube
from helmhive.kubeclient import translate_api_error
from helmhive.runner.kube import RunnerKube


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, Invalid),
        (401, Forbidden),
        (403, Forbidden),
        (404, NotFound),
        (409, Conflict),
        (422, Invalid),
        (429, Unavailable),
        (500, Unavailable),
        (503, Unavailable),
        (0, Unavailable),
        (418, KubeError),
    ],
)
def test_an_answer_maps_by_its_status(status: int, cls: type[KubeError]) -> None:
    body = json.dumps({"kind": "Status", "message": f"refused with {status}"})
    error = build_kube_error(status, body, "Reason Phrase")
    assert type(error) is cls
    assert (error.status, error.message) == (status, f"refused with {status}")


def test_the_message_falls_back_to_the_reason_and_is_bounded() -> None:
    assert build_kube_error(404, "not json", "Not Found").message == "Not Found"
    assert build_kube_error(404, "[1]", "Not Found").message == "Not Found"
    assert len(build_kube_error(422, json.dumps({"message": "x" * 5000}), None).message) == MAX_MESSAGE


def test_the_client_library_and_the_network_translate_onto_the_same_tree() -> None:
    answered = ApiException(status=409, reason="Conflict")
    answered.body = json.dumps({"message": "the object has been modified"})
    conflict = translate_api_error(answered)
    assert isinstance(conflict, Conflict) and conflict.message == "the object has been modified"

    silent = [
        urllib3.exceptions.MaxRetryError(None, "/apis", reason="refused"),  # type: ignore[arg-type]
        urllib3.exceptions.ReadTimeoutError(None, "/apis", "read timed out"),  # type: ignore[arg-type]
        ConnectionResetError("reset by peer"),
        TimeoutError("timed out"),
    ]
    for exc in silent:
        error = translate_api_error(exc)
        assert isinstance(error, Unavailable) and error.status == 0
        assert type(exc).__name__ in error.message
    already = NotFound(404, "gone")
    assert translate_api_error(already) is already


def _closed_port_client() -> client.ApiClient:
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    configuration = client.Configuration(host=f"https://127.0.0.1:{port}")
    configuration.verify_ssl = False
    configuration.retries = False
    return client.ApiClient(configuration)


def test_every_door_raises_unavailable_when_nothing_answers() -> None:
    kind = kind_by_name("AgentJob")
    with pytest.raises(Unavailable) as operator_side:
        door = Kube(_closed_port_client())
        run_closing(door.get(kind, "job", namespace="team-a"), door)
    with pytest.raises(Unavailable) as runner_side:
        asyncio.run(RunnerKube(_closed_port_client(), namespace="team-a").get_object("agentjobs", "job"))
    with pytest.raises(Unavailable) as cli_side:
        CliKube(_closed_port_client()).get("agentjobs", "job", "team-a")
    for raised in (operator_side.value, runner_side.value, cli_side.value):
        assert raised.status == 0 and raised.__cause__ is not None
