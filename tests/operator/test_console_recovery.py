"""The console's bad input in a real browser: a deleted object, a forbidden read, a lost API server.

Each shows a clear message on the page, and the page recovers by itself (from the watches, with
no reload) once the cause goes away. No operator is needed: the objects are only read.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from change_rig import change
from console_browser import chromium, console_process
from kubernetes import client
from playwright.sync_api import expect

from harness.cluster import ClusterHandle
from harness.kube import Kube
from harness.outage import ApiServerOutage

GROUP, VERSION = "helmhive.dev", "v1alpha1"
COMMIT = "0" * 40
FAST = {"HELMHIVE_CLI_TIMEOUT_SECONDS": "5"}  # each call of the console gives up soon while the server is away


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _create(kube: Kube, namespace: str, name: str) -> None:
    body = change(name, "git://127.0.0.1/payments.git", COMMIT, "nothing")
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "changes", body)


def test_a_deleted_object_a_forbidden_read_and_a_lost_api_server_are_shown_and_recovered_from(
    crds: list[str],
    cluster: ClusterHandle,
    kube: Kube,
    namespace: str,
    service_account_identity: Any,
    outage: ApiServerOutage,
    tmp_path: Path,
) -> None:
    _create(kube, namespace, "c1")
    port = _free_port()
    nobody = service_account_identity(namespace, "nobody")
    with (
        console_process(cluster.kubeconfig, namespace, tmp_path / "admin.log", env=FAST) as url,
        console_process(
            nobody.kubeconfig, namespace, tmp_path / "nobody.log", env=FAST, args=("--port", str(port))
        ) as nobody_url,
        chromium() as browser,
    ):
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url)
        page.goto(f"http://127.0.0.1:{urlsplit(url).port}/changes/{namespace}/c1")
        heading = page.locator("main h1")
        expect(heading).to_contain_text(f"Change {namespace}/c1")
        expect(page.locator("#live")).to_have_text("live", timeout=30_000)
        # By keyboard: the first Tab reaches the skip link, Enter moves the focus to the page's content.
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent") == "Skip to content"
        page.keyboard.press("Enter")
        assert page.evaluate("document.activeElement.id") == "main"
        page.evaluate("window.__sameDocument = true")

        # Deleted: said on the page; created again: shown again, without a reload.
        kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "changes", "c1")
        expect(page.locator("main")).to_contain_text("does not exist", timeout=30_000)
        _create(kube, namespace, "c1")
        expect(heading).to_contain_text(f"Change {namespace}/c1", timeout=30_000)

        # The API server goes away: the page says so; it comes back: the page recovers by itself.
        outage.stop()
        expect(page.locator("#live")).to_contain_text("live updates lost", timeout=30_000)
        expect(page.locator("main")).to_contain_text("cannot be reached", timeout=60_000)
        outage.start()
        expect(heading).to_contain_text(f"Change {namespace}/c1", timeout=60_000)
        expect(page.locator("#live")).to_have_text("live", timeout=60_000)
        assert page.evaluate("window.__sameDocument") is True

        # A user who may not list Changes sees the API server's refusal; once allowed, the list.
        other = browser.new_page()
        assert f"127.0.0.1:{port}/" in nobody_url  # --port is the port served
        other.goto(nobody_url)
        expect(other.locator("main")).to_contain_text("listing changes", timeout=30_000)
        expect(other.locator("main")).to_contain_text("403")
        other.evaluate("window.__sameDocument = true")
        kube.rbac.create_namespaced_role(
            namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="read-changes"),
                rules=[client.V1PolicyRule(api_groups=[GROUP], resources=["changes"], verbs=["get", "list", "watch"])],
            ),
        )
        kube.rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="nobody-reads-changes"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="read-changes"),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="nobody", namespace=namespace)],
            ),
        )
        expect(other.locator("#change-c1")).to_be_visible(timeout=60_000)
        assert other.evaluate("window.__sameDocument") is True
