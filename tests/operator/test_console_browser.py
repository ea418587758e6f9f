"""``helmhive console`` end to end in a real browser: the real operator, runner pods, API server and chromium.

One governed change with ``approval: Manual`` is followed in the browser from the overview to
its implementation; another user, who may edit Changes but lacks the ``approve`` verb, sees the
API server's refusal; a stale digest is not approved; the patch shown is ``change patch``'s;
a job that fails closed shows every candidate's reason; its profile's narrowing is on the profiles
page; an audit search by action filters the records; and no canary of the rig (provider and git
credentials, native session ids, memory text, a profile's instructions) is in any page or JSON answer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from change_rig import GIT_CANARY, PROVIDER_CANARY, SESSION_PREFIX, ChangeRig, change
from console_browser import chromium, console_process, screenshot
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from playwright.sync_api import Page, expect

from harness.cluster import ClusterHandle
from harness.wait import wait_for

GROUP = "helmhive.dev"
FINAL = ("ReviewApproved", "ChangesRequested", "ChecksFailed", "ImplementationFailed", "ReviewFailed")
MEMORY_CANARY = "canary-memory-text-4b7e"
INSTRUCTIONS_CANARY = "canary-profile-instructions-9c1d"
CANARIES = (PROVIDER_CANARY, GIT_CANARY, SESSION_PREFIX, MEMORY_CANARY, INSTRUCTIONS_CANARY)
WAIT_MS = 120_000


def _edit_changes_only(rig: ChangeRig, who: Any) -> None:
    """``who`` may read and patch Changes (no approve verb) and nothing else."""
    try:
        rig.kube.rbac.create_cluster_role(
            client.V1ClusterRole(
                metadata=client.V1ObjectMeta(name="console-edit-changes"),
                rules=[
                    client.V1PolicyRule(
                        api_groups=[GROUP], resources=["changes"], verbs=["get", "list", "watch", "patch"]
                    )
                ],
            )
        )
    except ApiException as err:
        if err.status != 409:
            raise
    rig.kube.rbac.create_namespaced_role_binding(
        rig.namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="console-outsider"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="console-edit-changes"
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=who.service_account, namespace=rig.namespace)],
        ),
    )


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def _cli_patch(cluster: ClusterHandle, namespace: str, name: str) -> bytes:
    done = subprocess.run(
        [sys.executable, "-m", "helmhive", "change", "patch", name, "-n", namespace],
        capture_output=True,
        timeout=60,
        check=True,
        env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
    )
    return done.stdout


def _sweep(page: Page, base: str, paths: list[str]) -> int:
    """Fetch every path (page, fragment, JSON answer) with the console's cookie; no canary in any."""
    swept = 0
    for path in paths:
        for variant in (path, f"{path}?fragment=1", f"/api{path}" if path != "/" else "/api/"):
            answer = page.request.get(base + variant)
            text = answer.text()
            for canary in CANARIES:
                assert canary not in text, f"{canary!r} reached the browser in {variant}"
            swept += 1
    return swept


def test_a_manual_change_is_approved_in_the_browser_live_and_nothing_secret_reaches_it(
    rig: ChangeRig, cluster: ClusterHandle, service_account_identity: Any, tmp_path: Path
) -> None:
    ns = rig.namespace
    outsider = service_account_identity(ns, "outsider")
    _edit_changes_only(rig, outsider)
    with (
        console_process(cluster.kubeconfig, ns, tmp_path / "console.log") as url,
        console_process(outsider.kubeconfig, ns, tmp_path / "outsider.log") as outsider_url,
        chromium() as browser,
    ):
        base = f"{urlsplit(url).scheme}://{urlsplit(url).netloc}"
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url)  # the login URL sets the cookie and lands on the overview
        expect(page.locator("#live")).to_have_text("live", timeout=30_000)
        expect(page.locator("#runner-alpha-0")).to_contain_text("alpha", timeout=30_000)
        expect(page.locator("#runner-alpha-0 td[data-col=schedulable]")).to_contain_text("True")
        # The live update arrives without a reload: a mark set on this document survives it.
        page.evaluate("window.__sameDocument = true")
        rig.apply(change("gated", rig.url, rig.repo.head, "APPEND-LINE: app.py :: # gated\n", approval="Manual"))
        expect(page.locator("#change-gated")).to_contain_text("Manual", timeout=WAIT_MS)
        expect(page.locator("#change-gated")).to_contain_text("AwaitingApproval", timeout=WAIT_MS)
        assert page.evaluate("window.__sameDocument") is True
        screenshot(page, "overview-1280")

        page.locator("#change-gated a").click()
        digest_shown = page.locator("#plan-digest")
        expect(digest_shown).to_have_text(rig.get("changes", "gated")["status"]["plan"]["digest"])
        digest = digest_shown.inner_text()
        screenshot(page, "change-awaiting-approval")

        # Someone without the approve verb clicks Approve: the API server's refusal, as such.
        other = browser.new_page()
        other.goto(outsider_url)
        other.goto(f"http://127.0.0.1:{urlsplit(outsider_url).port}/changes/{ns}/gated")
        expect(other.locator("#plan-digest")).to_have_text(digest)
        other.locator("#approve").click()
        expect(other.locator("#flash")).to_contain_text("not approved", timeout=30_000)
        expect(other.locator("#flash")).to_contain_text("approve verb")
        expect(other.locator("#flash")).to_contain_text("the API server refused")
        assert "approvedPlan" not in rig.get("changes", "gated")["spec"]

        # A stale digest (the page's form altered to another plan's) is not approved.
        page.evaluate("document.querySelector('input[name=digest]').value = 'sha256:' + '0'.repeat(64)")
        page.locator("#approve").click()
        expect(page.locator("#flash")).to_contain_text(f"the plan is now {digest}", timeout=30_000)
        assert "approvedPlan" not in rig.get("changes", "gated")["spec"]

        # Approve, by keyboard: the button approves exactly the digest shown; the implementation starts.
        page.locator("#approve").focus()
        page.keyboard.press("Enter")
        expect(page.locator("#flash")).to_contain_text(f"approved plan {digest}", timeout=30_000)
        assert rig.get("changes", "gated")["spec"]["approvedPlan"]["digest"] == digest
        page.evaluate("window.__sameDocument = true")
        expect(page.locator("#stage-gated-impl-1")).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#approval")).to_contain_text(digest, timeout=WAIT_MS)

        # The patch shown is change patch's, byte for byte; it arrives live too.
        rig.wait_ready("gated", final=FINAL)
        expect(page.locator("#patch")).to_be_visible(timeout=WAIT_MS)
        assert page.evaluate("window.__sameDocument") is True
        cli_patch = _cli_patch(cluster, ns, "gated")
        assert page.locator("#patch").text_content() == cli_patch.decode()
        assert page.request.get(f"{base}/changes/{ns}/gated/patch").body() == cli_patch
        screenshot(page, "change-reviewed")

        # A job that fails closed shows every candidate's reason (the same code as explain-routing).
        rig.apply(
            {
                "apiVersion": "helmhive.dev/v1alpha1",
                "kind": "Profile",
                "metadata": {"name": "wants-opus"},
                "spec": {
                    "envelope": "review-probe",
                    "purpose": "tests",
                    "instructions": f"Be thorough. {INSTRUCTIONS_CANARY}",
                    "providerMappings": [{"provider": "alpha", "model": "claude-opus-4-1"}],
                },
            },
            {
                "apiVersion": "helmhive.dev/v1alpha1",
                "kind": "AgentJob",
                "metadata": {"name": "wants-opus"},
                "spec": {
                    "workspace": "payments",
                    "jobKind": "review-probe",
                    "profile": "wants-opus",
                    "request": {"title": "opus", "prompt": "do it"},
                },
            },
        )
        wait_for(
            lambda: any(
                c["type"] == "Routed" and c["status"] == "False"
                for c in (rig.get("agentjobs", "wants-opus").get("status") or {}).get("conditions") or []
            ),
            timeout=60,
            describe="wants-opus fails closed",
        )
        page.goto(f"{base}/jobs/{ns}/wants-opus")
        for runner in ("alpha-0", "beta-0"):
            expect(page.locator(f"#cand-{runner} td[data-col=reason]")).not_to_be_empty(timeout=30_000)
        expect(page.locator("#cand-alpha-0 td[data-col=reason]")).to_contain_text("ModelNotAdvertised")
        expect(page.locator("main")).to_contain_text("ModelNotAdvertised")
        screenshot(page, "job-failed-closed")
        page.goto(f"{base}/")
        expect(page.locator("table:has(#job-wants-opus) caption")).to_contain_text("Failed")
        expect(page.locator("#job-wants-opus td[data-col=message]")).to_contain_text("claude-opus-4-1")

        # The profiles page: wants-opus beside its envelope, its narrowing, Valid and its current revision.
        page.goto(f"{base}/profiles")
        mappings = page.locator("#profile-wants-opus-provider-mappings")
        expect(mappings.locator("td[data-col=effective]")).to_have_text("alpha/claude-opus-4-1", timeout=30_000)
        expect(mappings.locator("td[data-col=narrowed]")).to_have_text("yes")
        expect(page.locator("#profile-wants-opus-tools td[data-col=profile]")).to_have_text("(as the envelope)")
        expect(page.locator("#profile-wants-opus-tools td[data-col=envelope]")).to_have_text("read, search, think")
        expect(page.locator("#profile-wants-opus")).to_contain_text("Valid: True")
        expect(page.locator("#profile-wants-opus td[data-col=current]")).to_have_text(["current"])
        screenshot(page, "profiles")

        # The audit page: a search by action (by keyboard) leaves that action's records only.
        page.goto(f"{base}/audit")
        actions = page.locator("td[data-col=action]")
        expect(actions.filter(has_text="ChangeApproved")).to_have_count(1, timeout=30_000)
        page.select_option("#audit-action", "ProfileRevisionCreated")
        page.locator("#audit-go").focus()
        page.keyboard.press("Enter")
        expect(page.locator("#audit-count")).to_contain_text("records match", timeout=30_000)
        expect(page.locator("#audit-action")).to_have_value("ProfileRevisionCreated")
        expect(page.locator("tr:has(td[data-col=object]:text-is('Profile/wants-opus'))")).to_have_count(1)
        assert set(actions.all_inner_texts()) == {"ProfileRevisionCreated"}
        screenshot(page, "audit")

        # Readable at 400 px: the page does not scroll sideways (wide tables scroll inside their box).
        page.set_viewport_size({"width": 400, "height": 900})
        page.goto(f"{base}/changes/{ns}/gated")
        assert page.evaluate("document.documentElement.scrollWidth") <= 400
        screenshot(page, "change-400")

        # A memory record appears live on the memory page, with its scope and state but not its text.
        page.goto(f"{base}/memory")
        expect(page.locator("#live")).to_have_text("live", timeout=30_000)
        rig.apply(
            {
                "apiVersion": "helmhive.dev/v1alpha1",
                "kind": "MemoryRecord",
                "metadata": {"name": "cents"},
                "spec": {
                    "workspace": "payments",
                    "scope": {"type": "service", "service": "refunds"},
                    "kind": "constraint",
                    "text": f"Money is integer cents. {MEMORY_CANARY}",
                    "source": {"type": "adr", "url": "https://git.example.com/adr/4", "approvedBy": "board"},
                    "sensitivity": "internal",
                },
            }
        )
        expect(page.locator("#memory-cents td[data-col=scope]")).to_have_text("service:refunds", timeout=30_000)
        active = wait_for(lambda: _condition(rig.get("memoryrecords", "cents"), "Active"), describe="Active")
        expect(page.locator("#memory-cents td[data-col=active]")).to_have_text(active["status"], timeout=30_000)
        if active["status"] != "True":  # why not: the operator's own reason, on the page
            expect(page.locator("#memory-cents td[data-col=why]")).to_contain_text(active["reason"])

        # The canary sweep: every page, fragment and JSON answer, the raw patch too.
        jobs = [j["name"] for j in rig.get("changes", "gated")["status"]["jobs"]]
        paths = [
            "/",
            "/memory",
            "/profiles",
            "/audit",
            f"/changes/{ns}/gated",
            *(f"/jobs/{ns}/{j}" for j in [*jobs, "wants-opus"]),
        ]
        assert _sweep(page, base, paths) == 3 * len(paths)
        raw = page.request.get(f"{base}/changes/{ns}/gated/patch").text()
        assert not any(canary in raw for canary in CANARIES)

        # Without the console's cookie nothing is answered.
        stranger = browser.new_context().new_page()
        assert stranger.request.get(f"{base}/api/").status == 401
