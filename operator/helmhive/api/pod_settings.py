"""Where and with what a RunnerPool's pods run: their resources, their scheduling and their metadata.

:class:`ContainerResources` is the runner container's ``resources``; :class:`Toleration` is a
pod's ``tolerations`` entry; :class:`PodMetadata` is the labels and annotations a pool adds to
its pods. All are checked here as the API server checks them when the pool is applied
(:data:`RESOURCE_RULES`, :data:`TOLERATION_RULE`, :data:`RESERVED_LABEL_RULE`,
:data:`RESERVED_ANNOTATION_RULE`: the same rules in CEL on the CRD), so a pool the API server
admits makes a StatefulSet it admits too. Quantities are read by :func:`parse_quantity` (pure;
the CRD's rules use the API server's own ``quantity()``).
"""

from __future__ import annotations

import enum
import re
from decimal import Context, Decimal
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator

from helmhive.api.common import ApiModel, LabelValue

__all__ = [
    "DEFAULT_JOB_MEMORY_BYTES",
    "DEFAULT_LIMITS",
    "DEFAULT_REQUESTS",
    "QUANTITY_PATTERN",
    "RESERVED_ANNOTATION_RULE",
    "RESERVED_LABEL_RULE",
    "RESOURCE_RULES",
    "TOLERATION_RULE",
    "ContainerResources",
    "NodeSelector",
    "PodMetadata",
    "QualifiedKey",
    "TaintEffect",
    "Toleration",
    "TolerationOperator",
    "decide_resource_problems",
    "parse_quantity",
]

QUANTITY_PATTERN = (
    r"^(([0-9]{1,9}(\.[0-9]{1,3})?|\.[0-9]{1,3})([mkMG]|[KMG]i|[eE][0-9])?"
    r"|([0-9]{1,6}(\.[0-9]{1,3})?|\.[0-9]{1,3})(T|Ti))$"
)
"""A Kubernetes quantity (``100m``, ``2Gi``, ``1.5``, ``1e9``, ``1Ti``) from a subset of the API server's
grammar: no sign, at most three decimals, at most nine digits before the point (six with ``T`` or
``Ti``), no ``P``, ``E``, ``n``, ``u`` or negative exponent. In that subset the API server keeps the
value exactly (it rounds finer than a nano-unit and caps huge binary values), so it compares as
:func:`parse_quantity` compares: every value is a multiple of 1e-6 below 2**63 (about 9.2e18)."""
Quantity = Annotated[str, StringConstraints(min_length=1, max_length=16, pattern=QUANTITY_PATTERN)]
ResourceName = Annotated[str, StringConstraints(pattern=r"^(cpu|memory|ephemeral-storage)$")]
"""``cpu``, ``memory`` or ``ephemeral-storage`` (extended resources and huge pages: not yet)."""

QualifiedKey = Annotated[
    str,
    StringConstraints(
        min_length=1,
        max_length=313,
        pattern=r"^([a-z0-9]([-a-z0-9]{0,47}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,47}[a-z0-9])?){0,4}/)?"
        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
    ),
]
"""A label's or an annotation's key, as a pod needs it (also a node label's in ``nodeSelector`` and
``tolerations``): a name of at most 63 characters, after an optional DNS prefix (here at most five
parts of at most 49 characters, so always within Kubernetes' 253)."""

NodeSelector = Annotated[dict[QualifiedKey, LabelValue], Field(max_length=32)]

DEFAULT_JOB_MEMORY_BYTES = 1024 * 1024 * 1024
"""``jobLimits.memoryBytes`` by default (1 GiB), which a memory limit the pool sets must hold."""
DEFAULT_REQUESTS = {"cpu": "100m", "memory": "256Mi"}
DEFAULT_LIMITS = {"memory": "2Gi"}


def _cel_map(field: str, default: dict[str, str]) -> str:
    """``self.spec.resources.<field>``, or its default when absent (the CRD cannot default a map)."""
    literal = ", ".join(f"'{k}': '{v}'" for k, v in default.items())
    path = f"self.spec.resources.{field}"
    return f"(has(self.spec.resources) && has({path}) ? {path} : {{{literal}}})"


_REQ, _LIM = _cel_map("requests", DEFAULT_REQUESTS), _cel_map("limits", DEFAULT_LIMITS)
_OWN_LIMITS = "self.spec.resources.limits"  # only as the pool wrote it: no default
_JOB_MEMORY = (
    "(has(self.spec.jobLimits) && has(self.spec.jobLimits.memoryBytes) ? self.spec.jobLimits.memoryBytes : "
    f"{DEFAULT_JOB_MEMORY_BYTES})"
)
RESOURCE_RULES: tuple[dict[str, str], ...] = (
    {
        "rule": (
            "['cpu', 'memory', 'ephemeral-storage'].all(k, "
            f"!(k in {_REQ}) || !(k in {_LIM}) || !isQuantity({_REQ}[k]) || !isQuantity({_LIM}[k]) || "
            f"quantity({_REQ}[k]).compareTo(quantity({_LIM}[k])) <= 0)"
        ),
        "message": "spec.resources.requests: a request is above its limit in spec.resources.limits",
        "fieldPath": ".spec.resources.requests",
    },
    {
        "rule": (
            f"!has(self.spec.resources) || !has({_OWN_LIMITS}) || !('memory' in {_OWN_LIMITS}) || "
            f"!isQuantity({_OWN_LIMITS}['memory']) || (quantity({_OWN_LIMITS}['memory']).isInteger() ? "
            f"quantity({_OWN_LIMITS}['memory']).asInteger() >= {_JOB_MEMORY} : "
            f"quantity({_OWN_LIMITS}['memory']).asApproximateFloat() >= double({_JOB_MEMORY}))"
        ),
        "message": (
            "spec.jobLimits.memoryBytes: above the runner pod's memory limit (spec.resources.limits.memory); "
            "a job could use more memory than the pod has"
        ),
        "fieldPath": ".spec.jobLimits.memoryBytes",
    },
)
"""The RunnerPool's CEL rules on its resources (the same checks as :meth:`RunnerPoolSpec._pool_rules`,
with the same messages). In the first, an absent ``requests`` or ``limits`` is its default, as the
model reads it. The second applies only to limits the pool sets: a pool written before
``resources`` existed, with ``jobLimits.memoryBytes`` above the default 2Gi, stays valid as it was.
``quantity()`` is the API server's own Kubernetes-quantity library."""


class ContainerResources(ApiModel):
    """The runner container's compute resources, as a container's ``resources`` (Kubernetes quantities).

    The runner and every job it runs share them: the memory limit bounds all of them together,
    so a limit the pool sets must be at least ``jobLimits.memoryBytes`` (and should leave room
    for ``concurrency`` jobs and the runner itself; see :data:`RESOURCE_RULES`).
    """

    requests: Annotated[
        dict[ResourceName, Quantity],
        Field(
            max_length=3, description="What the scheduler reserves for each runner pod. Default cpu 100m, memory 256Mi."
        ),
    ] = DEFAULT_REQUESTS
    limits: Annotated[
        dict[ResourceName, Quantity],
        Field(max_length=3, description="What each runner pod may use at most. Default memory 2Gi."),
    ] = DEFAULT_LIMITS


class TolerationOperator(enum.StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


TOLERATION_RULE: dict[str, Any] = {
    "rule": (
        "(self.operator == 'Exists' ? (!has(self.value) || self.value == '') : has(self.key)) && "
        "(!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute'))"
    ),
    "message": (
        "a toleration with operator Exists has no value, one with operator Equal needs a key, "
        "and tolerationSeconds needs effect NoExecute"
    ),
}
"""The pod validation's rules for a toleration, as a CEL rule on each entry (:meth:`Toleration._rules`)."""


class Toleration(ApiModel):
    """A taint the runner pods tolerate, as a pod's ``tolerations`` entry."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [TOLERATION_RULE]})

    key: QualifiedKey | None = None
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: LabelValue = ""
    effect: TaintEffect | None = None
    """Empty: every effect."""
    toleration_seconds: Annotated[int, Field(ge=0, le=31536000)] | None = None
    """With ``NoExecute``: how long the pod stays bound after the taint appears (default: forever)."""

    @model_validator(mode="after")
    def _rules(self) -> Toleration:
        holds = not self.value if self.operator is TolerationOperator.EXISTS else self.key is not None
        if not holds or (self.toleration_seconds is not None and self.effect is not TaintEffect.NO_EXECUTE):
            raise ValueError(TOLERATION_RULE["message"])
        return self


RESERVED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/managed-by",
    "controller-revision-hash",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
)
"""The pods' own labels: the StatefulSet's selector (Helmhive's) and what the StatefulSet controller sets."""
_HELMHIVE_KEY = r"^([^/]*[.])?helmhive[.]dev/"
"""A key under ``helmhive.dev`` or one of its subdomains: Helmhive's own labels and annotations."""
RESERVED_LABEL_RULE: dict[str, str] = {
    "rule": f"self.all(k, !(k in {list(RESERVED_LABELS)}) && !k.matches('{_HELMHIVE_KEY}'))",
    "message": (
        "a label key is reserved: helmhive.dev/… and the runner pods' own labels "
        f"({', '.join(RESERVED_LABELS)}) are set by Helmhive and the StatefulSet controller"
    ),
    "reason": "FieldValueInvalid",
}
_INTERPRETED = (
    r"^(seccomp[.]security[.]alpha[.]kubernetes[.]io/|controller[.]kubernetes[.]io/pod-deletion-cost$"
    r"|kubernetes[.]io/config[.]mirror$|scheduler[.]alpha[.]kubernetes[.]io/tolerations$)"
)
"""Pod annotations the API server validates against the pod (a seccomp profile that must match the
runner pod's own, a deletion cost, a mirror pod, tolerations): a pool could be admitted and its
StatefulSet refused. (AppArmor's and per-container seccomp's keys are already longer than a key may be.)"""
RESERVED_ANNOTATION_RULE: dict[str, str] = {
    "rule": f"self.all(k, !k.matches('{_HELMHIVE_KEY}') && !k.matches('{_INTERPRETED}'))",
    "message": (
        "an annotation key is reserved: helmhive.dev/… annotations are set by Helmhive, and those the API "
        "server checks against the pod (seccomp.security.alpha.kubernetes.io/…, "
        "controller.kubernetes.io/pod-deletion-cost, kubernetes.io/config.mirror, "
        "scheduler.alpha.kubernetes.io/tolerations) would make the runner pods invalid"
    ),
    "reason": "FieldValueInvalid",
}
AnnotationValue = Annotated[str, StringConstraints(max_length=4096)]


class PodMetadata(ApiModel):
    """Labels and annotations for the runner pods (the template of the pool's StatefulSet).

    For example a cluster autoscaler's ``cluster-autoscaler.kubernetes.io/safe-to-evict``, a service
    mesh's opt-out, or labels a cost report groups by. Helmhive's own keys are refused, not silently
    overwritten (:data:`RESERVED_LABEL_RULE`, :data:`RESERVED_ANNOTATION_RULE`); a change rolls the pods.
    """

    labels: Annotated[
        dict[QualifiedKey, LabelValue],
        Field(
            max_length=32,
            description="Labels added to each runner pod.",
            json_schema_extra={"x-kubernetes-validations": [RESERVED_LABEL_RULE]},
        ),
    ] = {}
    annotations: Annotated[
        dict[QualifiedKey, AnnotationValue],
        Field(
            max_length=32,
            description="Annotations added to each runner pod (values of at most 4096 characters).",
            json_schema_extra={"x-kubernetes-validations": [RESERVED_ANNOTATION_RULE]},
        ),
    ] = {}

    @field_validator("labels")
    @classmethod
    def _own_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        if any(k in RESERVED_LABELS or _HELMHIVE.match(k) for k in labels):
            raise ValueError(RESERVED_LABEL_RULE["message"])
        return labels

    @field_validator("annotations")
    @classmethod
    def _own_annotations(cls, annotations: dict[str, str]) -> dict[str, str]:
        if any(_HELMHIVE.match(k) or _INTERPRETED_KEY.match(k) for k in annotations):
            raise ValueError(RESERVED_ANNOTATION_RULE["message"])
        return annotations


_HELMHIVE = re.compile(_HELMHIVE_KEY)
_INTERPRETED_KEY = re.compile(_INTERPRETED)


def parse_quantity(text: str) -> Decimal:
    """The exact value of a quantity that matches :data:`QUANTITY_PATTERN` (``2Gi`` is 2147483648). Pure.

    Raises ValueError for anything else.
    """
    if _QUANTITY.fullmatch(text) is None:  # not match: "$" would also take a final newline
        raise ValueError(f"not a quantity: {text!r}")
    number = _NUMBER.match(text)
    assert number is not None  # the pattern matched: it starts with digits or a point
    digits = number.group(0)
    suffix = text[len(digits) :]
    value = Decimal(digits)
    if suffix in _SUFFIX:
        return _EXACT.multiply(value, _SUFFIX[suffix])
    return value.scaleb(int(suffix[1:]), context=_EXACT)  # e<digit>


def decide_resource_problems(resources: ContainerResources, *, job_memory_bytes: int | None) -> list[str]:
    """The :data:`RESOURCE_RULES` that ``resources`` breaks, as their messages. Pure.

    ``job_memory_bytes`` is None when the pool sets no ``limits`` of its own (the second rule then
    does not apply, see :data:`RESOURCE_RULES`).
    """
    problems = []
    limits = {name: parse_quantity(q) for name, q in resources.limits.items()}
    if any(parse_quantity(q) > limits[name] for name, q in resources.requests.items() if name in limits):
        problems.append(RESOURCE_RULES[0]["message"])
    memory = limits.get("memory")
    # Exact. The CEL rule is exact only for a value Go keeps as an int64 at scale 0 ("2Gi") and
    # compares others ("1.5Gi", "2000m") by asApproximateFloat(); within QUANTITY_PATTERN both
    # agree (a value that is not whole is at least 0.001 from one; test_foundation.py's
    # agreement test sends the edges to the API server).
    if memory is not None and job_memory_bytes is not None and memory < job_memory_bytes:
        problems.append(RESOURCE_RULES[1]["message"])
    return problems


_QUANTITY = re.compile(QUANTITY_PATTERN)
_NUMBER = re.compile(r"[0-9]*(\.[0-9]*)?")
_EXACT = Context(prec=64)
"""More digits than any quantity of the pattern needs (twelve, times at most 1024**4): nothing is rounded."""
_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    **{f"{p}i": Decimal(1024) ** (i + 1) for i, p in enumerate("KMGT")},
}
