"""A loaded client reads its credentials at most once a second, and a refreshed token still reaches the
API server within that second (:func:`helmhive.kubeclient.throttle_credential_refresh`).

Every kind of request shares it: the operator's plain JSON requests on a thread (:meth:`Kube.request`,
which its watch uses) and on the event loop (every other JSON call, :mod:`helmhive.controller.kube.http`),
and the generated client's calls, which the runner's door makes. Two real ServiceAccount tokens; the API
server itself says who each request authenticated as (a SelfSubjectReview). The refresh hook is
the kubernetes client's own mechanism, as its kubeconfig loader installs one; here it hands out
whichever token the test made current.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from kubernetes import client, config

from harness.aio import run_closing
from harness.identity import Identity
from harness.kube import IdentityFactory
from helmhive.controller.kube.door import Kube
from helmhive.kubeclient import CREDENTIAL_REFRESH_SECONDS, throttle_credential_refresh

REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
REVIEW_BODY = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}


def _who(kube: Kube) -> str:
    """The username the API server authenticated this plain JSON request as (the operator's door)."""
    response = kube.request("POST", REVIEW, REVIEW_BODY)
    assert response.status == 201, response.data
    return str(orjson.loads(response.data)["status"]["userInfo"]["username"])


def _who_generated(api: Any) -> str:
    """The username the API server authenticated this generated-client call as (the runner's door)."""
    review = client.AuthenticationV1Api(api).create_self_subject_review(REVIEW_BODY)
    return str(review.status.user_info.username)


@dataclass
class _Rotating:
    """A client whose refresh hook hands out ``token`` (the test rotates it), read on the clock ``now``."""

    api: Any
    token: str
    reads: list[str] = field(default_factory=list)
    now: float = 100.0

    def clock(self) -> float:
        return self.now


def _rotating(identity: Identity) -> _Rotating:
    rotating = _Rotating(api=identity.api_client(), token=identity.token)

    def refresh(configuration: Any) -> None:  # the client calls this on every auth_settings()
        rotating.reads.append(rotating.token)
        configuration.api_key = {"BearerToken": f"Bearer {rotating.token}"}

    rotating.api.configuration.refresh_api_key_hook = refresh
    return rotating


def test_the_token_is_read_once_a_second_and_a_refreshed_one_is_used_after_it(
    namespace: str, service_account_identity: IdentityFactory
) -> None:
    first: Identity = service_account_identity(namespace, "first")
    second: Identity = service_account_identity(namespace, "second")
    rotating = _rotating(first)
    api, reads = rotating.api, rotating.reads
    throttle_credential_refresh(api.configuration, monotonic=rotating.clock)
    throttled = api.configuration.refresh_api_key_hook
    throttle_credential_refresh(api.configuration, monotonic=rotating.clock)
    assert api.configuration.refresh_api_key_hook is throttled, "throttling twice does not wrap twice"
    kube = Kube(api)

    assert [_who(kube) for _ in range(5)] + [_who_generated(api) for _ in range(5)] == [first.username] * 10
    assert len(reads) == 1, "ten requests within the second, of both kinds, read the credentials once"

    rotating.token = second.token  # rotated: the client still holds the first token
    rotating.now += CREDENTIAL_REFRESH_SECONDS / 2
    assert (_who(kube), _who_generated(api)) == (first.username, first.username)
    assert len(reads) == 1

    rotating.now += CREDENTIAL_REFRESH_SECONDS  # past the second: the next request reads the new token
    assert _who_generated(api) == second.username
    assert _who(kube) == second.username
    assert len(reads) == 2


def test_requests_on_the_event_loop_read_the_credentials_the_same_way(
    namespace: str, service_account_identity: IdentityFactory
) -> None:
    """The door's JSON calls (sent on the event loop, :mod:`helmhive.controller.kube.http`) share the throttle."""
    first: Identity = service_account_identity(namespace, "loop-first")
    second: Identity = service_account_identity(namespace, "loop-second")
    rotating = _rotating(first)
    throttle_credential_refresh(rotating.api.configuration, monotonic=rotating.clock)
    kube = Kube(rotating.api)

    async def who() -> str:
        answer = await kube._json_call("POST", REVIEW, REVIEW_BODY)
        return str(answer["status"]["userInfo"]["username"])

    async def scenario() -> None:
        assert [await who() for _ in range(5)] == [first.username] * 5
        assert len(rotating.reads) == 1, "five requests within the second read the credentials once"
        rotating.token = second.token
        rotating.now += CREDENTIAL_REFRESH_SECONDS / 2
        assert await who() == first.username and len(rotating.reads) == 1
        rotating.now += CREDENTIAL_REFRESH_SECONDS
        assert await who() == second.username, "past the second the rotated token is used"
        assert len(rotating.reads) == 2

    run_closing(scenario(), kube)


def test_a_refresh_that_fails_is_tried_again_on_the_next_request(
    namespace: str, service_account_identity: IdentityFactory
) -> None:
    identity: Identity = service_account_identity(namespace, "flaky")
    api = identity.api_client()
    calls: list[bool] = []

    def refresh(configuration: Any) -> None:
        calls.append(True)
        if len(calls) == 1:
            raise OSError("the credential plugin is not answering")
        configuration.api_key = {"BearerToken": f"Bearer {identity.token}"}

    api.configuration.refresh_api_key_hook = refresh
    throttle_credential_refresh(api.configuration, monotonic=lambda: 100.0)
    kube = Kube(api)
    try:
        _who(kube)
    except OSError as exc:
        assert "not answering" in str(exc)
    else:
        raise AssertionError("the first refresh failed, so the first request must fail")
    assert _who(kube) == identity.username, "the clock did not move, yet the failed refresh was retried"
    assert _who(kube) == identity.username
    assert len(calls) == 2


def test_the_kubeconfig_loaders_own_hook_stays_throttled_after_it_runs(
    namespace: str, service_account_identity: IdentityFactory
) -> None:
    """The loader's hook installs a new hook of its own each time it runs; the throttle must stay in front.

    Before this was kept, the first refresh put the loader's unthrottled hook back, and every later
    request re-applied the whole kubeconfig (4% of the operator's samples in a routing burst).
    """
    identity: Identity = service_account_identity(namespace, "loaded")
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(identity.kubeconfig), client_configuration=configuration)
    now = [100.0]
    throttle_credential_refresh(configuration, monotonic=lambda: now[0])
    throttled = configuration.refresh_api_key_hook
    kube = Kube(client.ApiClient(configuration))

    assert _who(kube) == identity.username
    assert configuration.refresh_api_key_hook is throttled, "the loader's first run did not unthrottle it"
    loader = throttled.hook  # the loader's hook of the moment: it installs a new one each time it runs
    assert [_who(kube) for _ in range(5)] == [identity.username] * 5
    assert throttled.hook is loader, "within the second the loader did not run again"

    now[0] += 2 * CREDENTIAL_REFRESH_SECONDS
    assert _who(kube) == identity.username
    assert configuration.refresh_api_key_hook is throttled
    assert throttled.hook is not loader, "past the second the loader ran once more, and its new hook was kept"
    assert throttled.refreshed_at == now[0]
