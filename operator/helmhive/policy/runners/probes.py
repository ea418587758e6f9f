"""The objects that qualification runs through: a pool's Workspace and Profiles, and each probe's AgentJob. Pure.

A pool that names probes gets, in its namespace and owned by it (the garbage collector removes
them with it):

- a Workspace ``helmhive-qualification-<pool>`` binding each probe's job kind to
- a Profile ``helmhive-qualification-<pool>-<probe>`` per probe: the pool's provider with the
  runner's default model, a fresh session, no memory, and fixed instructions.

Each probe job is an ordinary AgentJob in the pool's namespace, owned by the Runner it qualifies,
labelled ``helmhive.dev/qualification=<runner>`` (routing pins it to that runner, and a
ValidatingAdmissionPolicy lets only the operator set the label), with a fixed request and no
source: the runner gives every job an empty scratch directory of its own.
"""

from __future__ import annotations

from typing import Any

from helmhive.api.kinds import API_VERSION
from helmhive.api.qualification import (
    QUALIFICATION_LABEL,
    QUALIFICATION_POOL_LABEL,
    QUALIFICATION_PROBE_LABEL,
    QUALIFICATION_ROUND_ANNOTATION,
    ProbeKind,
    QualificationSpec,
)
from helmhive.policy.runners.pool import PoolRef, build_owner_reference

__all__ = [
    "PROBE_PROMPTS",
    "build_probe_job",
    "build_qualification_objects",
    "qualification_object_names",
    "qualification_profile_name",
    "qualification_workspace_name",
]

_MANAGED = {"app.kubernetes.io/managed-by": "helmhive-operator"}

PROBE_PROMPTS: dict[ProbeKind, tuple[str, str]] = {
    ProbeKind.CONNECTION_TEST: (
        "Connection test",
        "This is an automated connection test of a Helmhive runner. Reply with one short sentence that says "
        "you are ready. Do not use any tool.",
    ),
    ProbeKind.IMPLEMENTATION_PROBE: (
        "Implementation probe",
        "This is an automated implementation probe of a Helmhive runner, in an empty scratch directory of its "
        "own. Create the file QUALIFICATION.md in the working directory with one line of text, then reply with "
        "one sentence that says what you did.",
    ),
    ProbeKind.REVIEW_PROBE: (
        "Review probe",
        "This is an automated review probe of a Helmhive runner. Review this diff against the criterion "
        "'the greeting is spelled correctly', and report your verdict and findings.\n\n"
        "```diff\n--- a/greeting.txt\n+++ b/greeting.txt\n@@ -1 +1 @@\n-helo, world\n+hello, world\n```",
    ),
}
"""(title, prompt) of each probe's request: fixed, so every runner is asked the same thing."""

_INSTRUCTIONS = (
    "You are being qualified by the Helmhive operator before you take work. Follow the request exactly and "
    "answer briefly."
)


def qualification_workspace_name(pool: str) -> str:
    return f"helmhive-qualification-{pool}"


def qualification_profile_name(pool: str, kind: ProbeKind) -> str:
    return f"helmhive-qualification-{pool}-{kind.value}"


def qualification_object_names(pool: str) -> list[tuple[str, str]]:
    """(kind, name) of every object :func:`build_qualification_objects` may build for ``pool``."""
    return [("Workspace", qualification_workspace_name(pool))] + [
        ("Profile", qualification_profile_name(pool, kind)) for kind in ProbeKind
    ]


def _meta(name: str, pool: PoolRef) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": pool.namespace,
        "labels": {**_MANAGED, QUALIFICATION_POOL_LABEL: pool.name},
        "ownerReferences": [build_owner_reference(pool)],
    }


def build_qualification_objects(pool: PoolRef, spec: QualificationSpec, *, provider: str) -> list[dict[str, Any]]:
    """The pool's qualification Workspace and one Profile per probe (to server-side apply)."""
    workspace = {
        "apiVersion": API_VERSION,
        "kind": "Workspace",
        "metadata": _meta(qualification_workspace_name(pool.name), pool),
        "spec": {
            # Never cloned: probe jobs have no source. A reserved host (RFC 2606) says so.
            "repository": {"url": f"https://qualification.helmhive.invalid/{pool.namespace}/{pool.name}"},
            "profiles": [
                {"jobKind": kind.value, "profile": qualification_profile_name(pool.name, kind)} for kind in spec.probes
            ],
        },
    }
    profiles = [
        {
            "apiVersion": API_VERSION,
            "kind": "Profile",
            "metadata": _meta(qualification_profile_name(pool.name, kind), pool),
            "spec": {
                "envelope": kind.value,
                "purpose": f"Qualifies the runners of pool {pool.name} ({kind.value}).",
                "instructions": _INSTRUCTIONS,
                "providerMappings": [{"provider": provider}],
            },
        }
        for kind in spec.probes
    ]
    return [workspace, *profiles]


def build_probe_job(
    *,
    pool: PoolRef,
    runner: str,
    runner_uid: str,
    kind: ProbeKind,
    name: str,
    round_: int,
    timeout_seconds: int,
) -> dict[str, Any]:
    """The AgentJob of one probe of one runner (owned by the Runner, so it goes when the runner goes)."""
    title, prompt = PROBE_PROMPTS[kind]
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentJob",
        "metadata": {
            "name": name,
            "namespace": pool.namespace,
            "labels": {
                **_MANAGED,
                QUALIFICATION_LABEL: runner,
                QUALIFICATION_POOL_LABEL: pool.name,
                QUALIFICATION_PROBE_LABEL: kind.value,
            },
            "annotations": {QUALIFICATION_ROUND_ANNOTATION: str(round_)},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "Runner",
                    "name": runner,
                    "uid": runner_uid,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {
            "workspace": qualification_workspace_name(pool.name),
            "jobKind": kind.value,
            "request": {"title": f"{title} of runner {runner} (round {round_})", "prompt": prompt},
            "timeoutSeconds": timeout_seconds,
        },
    }
