"""Every condition type and every reason name Helmhive uses, in one place.

Reasons are fixed CamelCase names (``[A-Za-z][A-Za-z0-9_,:]*``), never free text, so
dashboards and alerts can match on them. A reason that carries a detail uses a colon,
for example ``MissingCapability:diff_review``; :func:`detailed` builds those for
condition reasons. Routing candidate reasons (``MissingLabel:domain=code``) are not
condition reasons and keep their detail as written.

This module does no I/O.
"""

from __future__ import annotations

import enum
import re

__all__ = ["ConditionType", "Reason", "detailed"]


class ConditionType(enum.StrEnum):
    """Condition types, per kind."""

    # Every kind
    READY = "Ready"
    # Envelope
    PUBLISHED = "Published"
    # Profile
    VALID = "Valid"
    # MemoryRecord
    ACTIVE = "Active"
    # Runner
    ONLINE = "Online"
    AUTHENTICATED = "Authenticated"
    SCHEDULABLE = "Schedulable"
    # AgentJob
    ROUTED = "Routed"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    # Change
    PLANNED = "Planned"
    APPROVED = "Approved"
    IMPLEMENTED = "Implemented"
    CHECKED = "Checked"
    REVIEWED = "Reviewed"
    # Workspace
    PROFILES_RESOLVED = "ProfilesResolved"
    # RunnerPool (added with runner pools)
    CREDENTIAL_AVAILABLE = "CredentialAvailable"
    WARM_PODS_READY = "WarmPodsReady"
    """A JobPod pool's warm set (``execution.warmPods``): are that many warm pods ready to be claimed."""
    # Runner and RunnerPool (``helmhive.policy.runners.capabilities``)
    CAPABILITIES_ADVERTISED = "CapabilitiesAdvertised"
    """Does the agent advertise every agent capability the pool declares (``session-load``, ``mcp-http``…)."""
    # Runner (``helmhive.policy.runners.qualification``)
    QUALIFIED = "Qualified"
    """Has the runner passed its pool's qualification probes, recently enough (only when the pool names probes)."""
    # SuggestionExport
    RECORDED = "Recorded"
    # kstatus's abnormal-true conditions, derived from the above (``helmhive.policy.kstatus``)
    RECONCILING = "Reconciling"
    """True while the object is progressing (queued, running, a stage pending, pods starting); absent otherwise."""
    STALLED = "Stalled"
    """True while it has failed and will not progress without a person; absent otherwise."""


class Reason(enum.StrEnum):
    """Reason names. Grouped by the condition they usually explain."""

    # Generic
    RECONCILED = "Reconciled"
    PENDING = "Pending"
    INVALID_SPEC = "InvalidSpec"
    # Envelope
    MATCHES_CODE = "MatchesCode"
    RESTORED = "Restored"
    # Profile verdicts
    VALID = "Valid"
    UNKNOWN_ENVELOPE = "UnknownEnvelope"
    TOOL_OUTSIDE_ENVELOPE = "ToolOutsideEnvelope"
    FILESYSTEM_WIDER_THAN_ENVELOPE = "FilesystemWiderThanEnvelope"
    NETWORK_WIDER_THAN_ENVELOPE = "NetworkWiderThanEnvelope"
    OUTPUT_CONTRACT_MISMATCH = "OutputContractMismatch"
    INVALID_OUTPUT_SCHEMA = "InvalidOutputSchema"
    REVIEW_PROFILE_WRITES = "ReviewProfileWrites"
    SESSION_POLICY_FORBIDDEN = "SessionPolicyForbidden"
    MEMORY_FORBIDDEN = "MemoryForbidden"
    NO_PROVIDER_MAPPINGS = "NoProviderMappings"
    DUPLICATE_MAPPING = "DuplicateMapping"
    FALLBACK_EQUALS_PRIMARY = "FallbackEqualsPrimary"
    PROFILE_NOT_FOUND = "ProfileNotFound"
    PROFILE_NOT_VALID = "ProfileNotValid"
    # Memory
    IN_EFFECT = "InEffect"
    EXPIRED = "Expired"
    SERVICE_NOT_IN_WORKSPACE = "ServiceNotInWorkspace"
    WORKSPACE_NOT_FOUND = "WorkspaceNotFound"
    SENSITIVITY_ABOVE_POLICY = "SensitivityAbovePolicy"
    OUT_OF_SCOPE = "OutOfScope"
    OVER_LIMIT = "OverLimit"
    # Runner
    HEARTBEAT_FRESH = "HeartbeatFresh"
    HEARTBEAT_STALE = "HeartbeatStale"
    HEARTBEAT_HELD = "HeartbeatHeld"
    """The heartbeat looks stale only because the operator lost the API server: not Offline yet."""
    NEVER_REPORTED = "NeverReported"
    AUTHENTICATED = "Authenticated"
    UNAUTHENTICATED = "Unauthenticated"
    ADAPTER_FAILING = "AdapterFailing"
    CONTROL_DRAINING = "Draining"
    CONTROL_DISABLED = "Disabled"
    CONTROL_REVOKED = "Revoked"
    CREDENTIAL_ROTATED = "CredentialRotated"
    CREDENTIAL_MISSING = "CredentialMissing"
    SCHEDULABLE = "Schedulable"
    NOT_SCHEDULABLE = "NotSchedulable"
    # Runner qualification (``Qualified``; each but QUALIFIED also makes Schedulable False)
    QUALIFIED = "Qualified"
    QUALIFICATION_PENDING = "QualificationPending"
    """No round has passed yet for this registration and credential: the probes run (or wait to)."""
    QUALIFICATION_FAILED = "QualificationFailed"
    QUALIFICATION_STALE = "QualificationStale"
    # Routing
    ASSIGNED = "Assigned"
    NO_ELIGIBLE_RUNNER = "NoEligibleRunner"
    WAITING_FOR_CAPACITY = "WaitingForCapacity"
    CAPACITY_DEADLINE_EXCEEDED = "CapacityDeadlineExceeded"
    MODEL_NOT_ADVERTISED = "ModelNotAdvertised"
    MISSING_CAPABILITY = "MissingCapability"
    MISSING_LABEL = "MissingLabel"
    NO_FREE_CONCURRENCY = "NoFreeConcurrency"
    NAMESPACE_NOT_SERVED = "NamespaceNotServed"
    PROVIDER_NOT_IN_MAPPINGS = "ProviderNotInMappings"
    MODEL_OVERRIDE_FORBIDDEN = "ModelOverrideForbidden"
    # Execution
    STARTED = "Started"
    COMPLETED = "Completed"
    CANCELLED = "Cancelled"
    TIMED_OUT = "TimedOut"
    RUNNER_LOST = "RunnerLost"
    AGENT_CRASHED = "AgentCrashed"
    OUTPUT_CONTRACT_VIOLATED = "OutputContractViolated"
    # Change
    STAGE_PENDING = "StagePending"
    STAGE_RUNNING = "StageRunning"
    STAGE_SUCCEEDED = "StageSucceeded"
    STAGE_FAILED = "StageFailed"
    # Profile verdicts (added with the pure profile core)
    LABEL_CONFLICTS_WITH_ENVELOPE = "LabelConflictsWithEnvelope"
    PROFILE_KIND_MISMATCH = "ProfileKindMismatch"
    # Memory selection
    MEMORY_DISABLED = "MemoryDisabled"
    # Offline validation (``helmhive validate``)
    INVALID_YAML = "InvalidYaml"
    INVALID_DOCUMENT = "InvalidDocument"
    UNKNOWN_KIND = "UnknownKind"
    WRONG_API_VERSION = "WrongApiVersion"
    UNKNOWN_FIELD = "UnknownField"
    DUPLICATE_OBJECT = "DuplicateObject"
    ENVELOPE_DIFFERS_FROM_CODE = "EnvelopeDiffersFromCode"
    UNREADABLE_FILE = "UnreadableFile"
    NO_OBJECTS = "NoObjects"
    # Runner pools and runners (added with the runner-pool reconciler)
    LEASE_MISSING = "LeaseMissing"
    AUTHENTICATION_UNKNOWN = "AuthenticationUnknown"
    AUTH_STALE = "AuthStale"
    REPORT_STALE = "ReportStale"
    CREDENTIAL_FOUND = "CredentialFound"
    CREDENTIAL_NOT_REQUIRED = "CredentialNotRequired"
    APPLY_FAILED = "ApplyFailed"
    # Routing candidates (added with the router)
    SELECTED = "Selected"
    NOT_PREFERRED = "NotPreferred"
    NO_DEFAULT_MODEL = "NoDefaultModel"
    POOL_NOT_FOUND = "PoolNotFound"
    # Execution by the runner (added with job execution)
    FORK_UNSUPPORTED = "ForkUnsupported"
    RESUME_UNSUPPORTED = "ResumeUnsupported"
    SESSION_NOT_FOUND = "SessionNotFound"
    AGENT_FAILED = "AgentFailed"
    AGENT_UNRESPONSIVE = "AgentUnresponsive"
    INTERRUPTED = "Interrupted"
    SANDBOX_UNAVAILABLE = "SandboxUnavailable"
    ARTIFACT_STORE_FAILED = "ArtifactStoreFailed"
    MEMORY_DROPPED = "MemoryDropped"
    SESSION_NOT_STORED = "SessionNotStored"
    SESSION_COMPACTED = "SessionCompacted"
    COMPACTION_FAILED = "CompactionFailed"
    RUNNER_API_FAILED = "RunnerApiFailed"
    # Retry verdicts (``helmhive.policy.agentjob.retry``)
    RETRY_ALLOWED = "RetryAllowed"
    MAY_HAVE_SIDE_EFFECTS = "MayHaveSideEffects"
    NOT_RETRYABLE = "NotRetryable"
    RETRY_LIMIT_REACHED = "RetryLimitReached"
    RETRY_WINDOW_PASSED = "RetryWindowPassed"
    # The exact source, fetched by the runner (added with governed changes)
    REPOSITORY_NOT_FOUND = "RepositoryNotFound"
    COMMIT_NOT_FOUND = "CommitNotFound"
    SOURCE_UNAVAILABLE = "SourceUnavailable"
    SOURCE_AUTH_FAILED = "SourceAuthFailed"
    SOURCE_MISMATCH = "SourceMismatch"
    SOURCE_REQUIRED = "SourceRequired"
    # Patches and checks, computed and run by the runner
    NO_CHANGES = "NoChanges"
    PATCH_TOO_LARGE = "PatchTooLarge"
    PATCH_UNAVAILABLE = "PatchUnavailable"
    PATCH_DIGEST_MISMATCH = "PatchDigestMismatch"
    PATCH_DOES_NOT_APPLY = "PatchDoesNotApply"
    CHECKS_PASSED = "ChecksPassed"
    CHECKS_FAILED = "ChecksFailed"
    NO_CHECKS = "NoChecks"
    # The Change controller
    WAITING_FOR_WORKSPACE = "WaitingForWorkspace"
    PLAN_READY = "PlanReady"
    AWAITING_APPROVAL = "AwaitingApproval"
    APPROVAL_DIGEST_MISMATCH = "ApprovalDigestMismatch"
    APPROVED_AUTOMATICALLY = "ApprovedAutomatically"
    APPROVED_MANUALLY = "ApprovedManually"
    PATCH_READY = "PatchReady"
    REVIEW_APPROVED = "ReviewApproved"
    CHANGES_REQUESTED = "ChangesRequested"
    PLANNING_FAILED = "PlanningFailed"
    IMPLEMENTATION_FAILED = "ImplementationFailed"
    REVIEW_FAILED = "ReviewFailed"
    JOB_MISSING = "JobMissing"
    INVALID_STAGE_OUTPUT = "InvalidStageOutput"
    # Patches made by the runner (added with the governed runner side)
    PATCH_NOT_TEXT = "PatchNotText"
    # Waiting for a reference that does not exist yet (``helmhive.policy.waiting``); with WAITING_FOR_WORKSPACE
    WAITING_FOR_PROFILE = "WaitingForProfile"
    # Per-job resource limits on the agent (``helmhive.runner.sandbox.limits``); the detail names the limit:
    # ``ResourceLimitExceeded:memory|cpu|processes|files|disk``
    RESOURCE_LIMIT_EXCEEDED = "ResourceLimitExceeded"
    # Job pods (``RunnerPool.spec.execution.mode: JobPod``; ``helmhive.policy.jobpods.outcome``); with TIMED_OUT
    # and ``ResourceLimitExceeded:memory`` (the agent's container killed at its memory limit)
    JOB_POD_LOST = "JobPodLost"
    """The job's pod was evicted, preempted, disrupted, rejected by its node, or deleted while the job ran:
    an infrastructure failure, like RunnerLost. The detail names the cause (``JobPodLost:Evicted``)."""
    JOB_POD_FAILED = "JobPodFailed"
    """The job's pod cannot start a container; the detail is the container's reason
    (``JobPodFailed:ImagePullBackOff``), or it was not scheduled or started within the pool's
    ``execution.startTimeoutSeconds`` (``JobPodFailed:Unschedulable``, ``JobPodFailed:StartTimeout``).
    Final: it fails the same way again."""
    JOB_POD_CLAIMED = "JobPodClaimed"
    """An Event: the runner claimed a warm pod of its pool for the job (the message names the pod)."""
    JOB_POD_CREATED = "JobPodCreated"
    """An Event: no warm pod was free, so the runner created the job's pod (the message names it)."""
    # A JobPod pool's WarmPodsReady condition (``helmhive.policy.jobpods.warmset.decide_warm_condition``)
    WARM_PODS_READY = "WarmPodsReady"
    WARM_PODS_STARTING = "WarmPodsStarting"
    WARM_POD_FAILING = "WarmPodFailing"
    """A warm pod cannot start (its image, its configuration) or cannot be scheduled: the message names it."""
    WARM_PODS_NOT_KEPT = "WarmPodsNotKept"
    """The operator's create or delete of a warm pod was refused (a quota, an admission policy)."""
    NO_WARM_PODS = "NoWarmPods"
    """``execution.warmPods`` is 0: every job's pod is created when the job starts."""
    # Discovered capabilities (``helmhive.policy.runners.capabilities``) and routing on them
    ALL_ADVERTISED = "AllAdvertised"
    CAPABILITY_NOT_ADVERTISED = "CapabilityNotAdvertised"
    """The pool declares an agent capability its agent does not advertise: the runner does not offer it."""
    AGENT_NOT_PROBED = "AgentNotProbed"
    EFFORT_NOT_OFFERED = "EffortNotOffered"
    """A routing rejection, ``EffortNotOffered:<model>/<effort>``: the runner's catalogue does not offer
    that reasoning effort with that model."""
    # Policy suggestions (``helmhive.policy.suggestions``; ``helmhive suggestions``)
    NOT_A_SUGGESTION_JOB = "NotASuggestionJob"
    """The job is not a ``policy-suggestion`` job: it has no suggestions to list or export."""
    NO_SUGGESTIONS = "NoSuggestions"
    """The job has no structured output yet (not finished), or its output holds no suggestions."""
    INVALID_SUGGESTION = "InvalidSuggestion"
    """A suggestion that does not make a valid MemoryRecord; the message gives the field path."""
    OUTPUT_NOT_READABLE = "OutputNotReadable"
    """A job's output kept in its artifacts ConfigMap is missing, cut short, or not what the job recorded."""
    AUDIT_RECORDED = "AuditRecorded"
    """A SuggestionExport's ``SuggestionsExported`` AuditRecord exists."""
    # A RunnerPool's Reconciling condition (``helmhive.policy.kstatus``)
    RUNNER_PODS_STARTING = "RunnerPodsStarting"
    """Fewer of the pool's runners are Online than its ``replicas``: its pods are starting or rolling out."""


_DETAIL_RE = re.compile(r"[^A-Za-z0-9_,:]+")


def detailed(reason: Reason, detail: str) -> str:
    """Return ``Reason:detail`` with the detail reduced to characters a reason may hold."""
    cleaned = _DETAIL_RE.sub("_", detail).strip("_:,")[:96]
    return f"{reason.value}:{cleaned}" if cleaned else reason.value
