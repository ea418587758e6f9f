"""Building blocks of governed work shared by AgentJobs and Changes: exact source, checks, patches.

* :class:`SourceRef` names a git repository and a *full* commit id (40 hex digits, or 64 for
  SHA-256 repositories). Branches, tags and short ids are refused by the schema.
* :class:`CheckSpec` is one check a governed change declares; :class:`CheckEvidence` is its
  bounded result, written by the runner that ran it.
* :class:`PatchRef` is where a patch is kept (a ConfigMap owned by the implementation job)
  and its SHA-256, so a reviewer can verify it before rebuilding the patched tree.

This module does no I/O.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field, StringConstraints

from helmhive.api.common import DNS_LABEL_PATTERN, ApiModel, Name

__all__ = [
    "CHECK_OUTPUT_TAIL_MAX",
    "COMMIT_MESSAGE",
    "COMMIT_PATTERN",
    "MAX_CHECKS",
    "REPOSITORY_MESSAGE",
    "REPOSITORY_PATTERN",
    "ArtifactRef",
    "ChangeRef",
    "ChangeStage",
    "CheckEvidence",
    "CheckOutcome",
    "CheckSpec",
    "PatchRef",
    "Sha256Hex",
    "SourceRef",
]

COMMIT_PATTERN = r"^[0-9a-f]{40}([0-9a-f]{24})?$"
COMMIT_MESSAGE = "commit must be a full commit id (40 lowercase hex digits, or 64), never a branch, tag or short id"
REPOSITORY_PATTERN = r"^(https?|git)://[^@/?# ]+/[^?# ]*$"
REPOSITORY_MESSAGE = (
    "repository must be an https://, http:// or git:// URL with no credentials, query or fragment "
    "(credentials come from the runner pool's Secret)"
)
MAX_CHECKS = 8
CHECK_OUTPUT_TAIL_MAX = 4096
"""Characters of a check's output kept in status (the end of it); the whole output is hashed."""

Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$", max_length=64)]


class SourceRef(ApiModel):
    """An exact source: a git repository and a full commit id (never a branch, tag or short id)."""

    repository: Annotated[
        str,
        StringConstraints(min_length=1, max_length=2048, pattern=REPOSITORY_PATTERN),
        Field(
            json_schema_extra={
                "x-kubernetes-validations": [
                    {
                        "rule": f"self.matches('{REPOSITORY_PATTERN}')",
                        "message": REPOSITORY_MESSAGE,
                        "reason": "FieldValueInvalid",
                    }
                ]
            }
        ),
    ]
    """An ``https://``, ``http://`` or ``git://`` URL without credentials (those come from the pool's Secret)."""
    commit: Annotated[
        str,
        StringConstraints(pattern=COMMIT_PATTERN, max_length=64),
        Field(
            json_schema_extra={
                "x-kubernetes-validations": [
                    {
                        "rule": f"self.matches('{COMMIT_PATTERN}')",
                        "message": COMMIT_MESSAGE,
                        "reason": "FieldValueInvalid",
                    }
                ]
            }
        ),
    ]
    """The full commit id: 40 hex digits (64 for SHA-256 repositories). Never a branch, tag or short id."""


class ArtifactRef(ApiModel):
    """A large output kept in an owned ConfigMap (or Secret), referenced from status."""

    kind: Annotated[str, Field(pattern=r"^(ConfigMap|Secret)$", max_length=16)]
    name: Name
    key: Annotated[str, Field(max_length=253)]
    bytes: Annotated[int, Field(ge=0)]
    sha256: Annotated[str, Field(max_length=64)]
    truncated: bool = False


class ChangeStage(enum.StrEnum):
    PLANNING = "planning"
    IMPLEMENTATION = "implementation"
    REVIEW = "review"


class ChangeRef(ApiModel):
    """Set on the jobs a Change creates: which Change, which stage, which iteration."""

    name: Name
    stage: ChangeStage
    iteration: Annotated[int, Field(ge=1, le=3)] = 1
    """Implementation and review run once per iteration; planning is always iteration 1."""


class CheckSpec(ApiModel):
    """One check run by the runner on the patched tree, in the sandbox, with the network disabled."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
    command: Annotated[
        list[Annotated[str, StringConstraints(min_length=1, max_length=1024)]],
        Field(min_length=1, max_length=32),
    ]
    """The argv, run in the tree's root without a shell (use ``["sh", "-c", "…"]`` for one)."""
    timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = 300


class CheckOutcome(enum.StrEnum):
    PASSED = "Passed"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"
    NOT_RUN = "NotRun"
    """The command could not be started (not found, not executable)."""


class CheckEvidence(ApiModel):
    """A check's bounded evidence: how it ended, how long it took, and the end of its output."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=63)]
    outcome: CheckOutcome
    exit_code: int | None = None
    duration_seconds: Annotated[float, Field(ge=0)] = 0.0
    output_tail: Annotated[str, StringConstraints(max_length=CHECK_OUTPUT_TAIL_MAX)] = ""
    """The last characters of stdout and stderr together (decoded as UTF-8, invalid bytes replaced)."""
    output_bytes: Annotated[int, Field(ge=0)] = 0
    output_sha256: Sha256Hex | None = None
    """SHA-256 of the whole output, so the tail can be matched to a full log kept elsewhere."""

    @property
    def passed(self) -> bool:
        return self.outcome is CheckOutcome.PASSED


class PatchRef(ApiModel):
    """A patch computed by the runner with git against the exact commit, kept in an owned ConfigMap."""

    config_map: Name
    key: Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]
    bytes: Annotated[int, Field(ge=1)]
    sha256: Sha256Hex
    files: Annotated[int, Field(ge=0, le=100000)] = 0
