"""The operator's door reads its credential headers at most once a second, and a refreshed token still
reaches the API server within that second (:meth:`helmhive.controller.kube.Kube.auth_headers`).

Two real ServiceAccount tokens; the API server itself says who each request authenticated as
(a SelfSubjectReview). The refresh hook is the kubernetes client's own mechanism, as its
kubeconfig loader installs one; here it hands out whichever token the test made current.
"""

from __future__ import annotations

from typing import Any

import orjson

from harness.identity import Identity
from harness.kube import IdentityFactory
from helmhive.controller.kube import AUTH_HEADERS_TTL_SECONDS, Kube

REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


def _who(kube: Kube) -> str:
    """The username the API server authenticated this request as."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    response = kube.request("POST", REVIEW, body)
    assert response.status == 201, response.data
    return str(orjson.loads(response.data)["status"]["userInfo"]["username"])


def test_the_token_is_read_once_a_second_and_a_refreshed_one_is_used_after_it(
    namespace: str, service_account_identity: IdentityFactory
) -> None:
    first: Identity = service_account_identity(namespace, "first")
    second: Identity = service_account_identity(namespace, "second")
    api = first.api_client()
    current = {"token": first.token}
    reads: list[str] = []

    def refresh(configuration: Any) -> None:  # the client calls this on every auth_settings()
        reads.append(current["token"])
        configuration.api_key = {"BearerToken": f"Bearer {current['token']}"}

    api.configuration.refresh_api_key_hook = refresh
    now = [100.0]
    kube = Kube(api, monotonic=lambda: now[0])

    assert [_who(kube) for _ in range(10)] == [first.username] * 10
    assert len(reads) == 1, "ten requests within the second read the credentials once"

    current["token"] = second.token  # rotated: the cached headers still carry the first token
    now[0] += AUTH_HEADERS_TTL_SECONDS / 2
    assert _who(kube) == first.username
    assert len(reads) == 1

    now[0] += AUTH_HEADERS_TTL_SECONDS  # past the second: the next request reads the new token
    assert _who(kube) == second.username
    assert len(reads) == 2
