"""Where and with what a RunnerPool's pods run: their resources and their scheduling.

:class:`ContainerResources` is the runner container's ``resources``; :class:`Toleration` is a
pod's ``tolerations`` entry. Both are checked here as the API server checks them when the pool is
applied (:data:`RESOURCE_RULES`, :data:`TOLERATION_RULE`, the same rules in CEL on the CRD), so a
pool the API server admits makes a StatefulSet it admits too. Quantities are read by
:func:`parse_quantity` (pure; the CRD's rules use the API server's own ``quantity()``).
"""

from __future__ import annotations

import enum
import re
from decimal import Context, Decimal
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from helmhive.api.common import ApiModel, LabelKey, LabelValue

__all__ = [
    "DEFAULT_JOB_MEMORY_BYTES",
    "DEFAULT_LIMITS",
    "DEFAULT_REQUESTS",
    "QUANTITY_PATTERN",
    "RESOURCE_RULES",
    "TOLERATION_RULE",
    "ContainerResources",
    "TaintEffect",
    "Toleration",
    "TolerationOperator",
    "decide_resource_problems",
    "parse_quantity",
]

QUANTITY_PATTERN = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[mkMGTPE]|[eE][+-]?[0-9]{1,2})?$"
"""A non-negative Kubernetes quantity (``100m``, ``2Gi``, ``1.5``, ``1e9``): a subset of what the API
server's parser takes, so a quantity admitted here is one the StatefulSet is admitted with."""
Quantity = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=QUANTITY_PATTERN)]
ResourceName = Annotated[str, StringConstraints(pattern=r"^(cpu|memory|ephemeral-storage)$")]
"""``cpu``, ``memory`` or ``ephemeral-storage`` (extended resources and huge pages: not yet)."""

DEFAULT_JOB_MEMORY_BYTES = 1024 * 1024 * 1024
"""``jobLimits.memoryBytes`` by default (1 GiB), which the pod's memory limit must hold."""
DEFAULT_REQUESTS = {"cpu": "100m", "memory": "256Mi"}
DEFAULT_LIMITS = {"memory": "2Gi"}


def _cel_map(field: str, default: dict[str, str]) -> str:
    """``self.spec.resources.<field>``, or its default when absent (the CRD cannot default a map)."""
    literal = ", ".join(f"'{k}': '{v}'" for k, v in default.items())
    path = f"self.spec.resources.{field}"
    return f"(has(self.spec.resources) && has({path}) ? {path} : {{{literal}}})"


_REQ, _LIM = _cel_map("requests", DEFAULT_REQUESTS), _cel_map("limits", DEFAULT_LIMITS)
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
            f"!('memory' in {_LIM}) || !isQuantity({_LIM}['memory']) || "
            f"quantity({_LIM}['memory']).asApproximateFloat() >= double({_JOB_MEMORY})"
        ),
        "message": (
            "spec.jobLimits.memoryBytes: above the runner pod's memory limit (spec.resources.limits.memory); "
            "a job could use more memory than the pod has"
        ),
        "fieldPath": ".spec.jobLimits.memoryBytes",
    },
)
"""The RunnerPool's CEL rules on its resources (the same checks as :meth:`RunnerPoolSpec._resources`,
with the same messages; an absent ``requests`` or ``limits`` is its default, as the model reads it).
``quantity()`` is the API server's own Kubernetes-quantity library."""


class ContainerResources(ApiModel):
    """The runner container's compute resources, as a container's ``resources`` (Kubernetes quantities).

    The runner and every job it runs share them: the memory limit bounds all of them together,
    so it must be at least ``jobLimits.memoryBytes`` (and should leave room for ``concurrency``
    jobs and the runner itself).
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

    key: LabelKey | None = None
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


def parse_quantity(text: str) -> Decimal:
    """The value of a Kubernetes quantity that matches :data:`QUANTITY_PATTERN` (``2Gi`` is 2147483648). Pure.

    Raises ValueError for anything else.
    """
    found = _QUANTITY.match(text)
    if found is None:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = found.group(1), found.group(3) or ""
    value = Decimal(number)
    if suffix in _SUFFIX:  # "E" and "Ei" are exa and exbi, not an exponent
        return _EXACT.multiply(value, _SUFFIX[suffix])
    return value.scaleb(int(suffix[1:]), context=_EXACT)


def decide_resource_problems(resources: ContainerResources, *, job_memory_bytes: int) -> list[str]:
    """The :data:`RESOURCE_RULES` that ``resources`` breaks, as their messages. Pure."""
    problems = []
    limits = {name: parse_quantity(q) for name, q in resources.limits.items()}
    if any(parse_quantity(q) > limits[name] for name, q in resources.requests.items() if name in limits):
        problems.append(RESOURCE_RULES[0]["message"])
    memory = limits.get("memory")
    if memory is not None and float(memory) < float(job_memory_bytes):  # as the CEL rule: asApproximateFloat()
        problems.append(RESOURCE_RULES[1]["message"])
    return problems


_QUANTITY = re.compile(QUANTITY_PATTERN)
_EXACT = Context(prec=256)
"""Enough digits for any quantity of 64 characters times 1024**6 or 10**99: nothing is rounded."""
_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    **{f"{p}i": Decimal(1024) ** (i + 1) for i, p in enumerate("KMGTPE")},
}
