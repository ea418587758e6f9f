"""Whether a Workspace's active profiles resolve: each exists, is Valid, and fits its job kind. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from helmhive.api.memory import WorkspaceSpec
from helmhive.api.reasons import ConditionType, Reason
from helmhive.policy.conditions import find_condition

__all__ = ["WorkspaceVerdict", "decide_workspace"]


@dataclass(frozen=True, kw_only=True)
class WorkspaceVerdict:
    ready: bool
    reason: Reason
    message: str
    unresolved: list[str]


def decide_workspace(*, spec: WorkspaceSpec, profiles: Mapping[str, Mapping[str, Any]]) -> WorkspaceVerdict:
    """Decide ``Ready`` from the profiles of the workspace's namespace (by name, as objects).

    Each problem names its field path and reason: ``spec.profiles[0].profile: ProfileNotFound: …``.
    """
    problems: list[tuple[Reason, str, str]] = []
    for index, binding in enumerate(spec.profiles):
        at = f"spec.profiles[{index}].profile"
        profile = profiles.get(binding.profile)
        if profile is None:
            problems.append(
                (
                    Reason.PROFILE_NOT_FOUND,
                    binding.profile,
                    f"{at}: ProfileNotFound: {binding.job_kind.value}: profile {binding.profile} does not exist",
                )
            )
            continue
        envelope = (profile.get("spec") or {}).get("envelope")
        valid = find_condition((profile.get("status") or {}).get("conditions"), ConditionType.VALID)
        if envelope != binding.job_kind.value:
            problems.append(
                (
                    Reason.PROFILE_KIND_MISMATCH,
                    binding.profile,
                    f"{at}: ProfileKindMismatch: {binding.job_kind.value}: profile {binding.profile} is for {envelope}",
                )
            )
        elif valid is None or valid.get("status") != "True":
            problems.append(
                (
                    Reason.PROFILE_NOT_VALID,
                    binding.profile,
                    f"{at}: ProfileNotValid: {binding.job_kind.value}: profile {binding.profile} is not Valid",
                )
            )
    if not problems:
        count = len(spec.profiles)
        return WorkspaceVerdict(
            ready=True, reason=Reason.RECONCILED, message=f"{count} active profiles resolve", unresolved=[]
        )
    return WorkspaceVerdict(
        ready=False,
        reason=problems[0][0],
        message="; ".join(p[2] for p in problems)[:1024],
        unresolved=sorted({p[1] for p in problems})[:16],
    )
