"""The core/v1 Events the operator and the runner post: their wire form, built once. Pure.

Both doors (``helmhive.controller.kube.door``, ``helmhive.runner.kube``) post what
:func:`build_event` returns as plain JSON, and raise a series with
:func:`build_event_series_patch`, the way client-go's correlator does. The involved object's
reference (:func:`build_object_reference`) keeps only the fields the object has: an Event about
an object not created yet carries no ``uid`` rather than an empty one.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from helmhive.policy.timestamps import format_timestamp

__all__ = ["MAX_EVENT_MESSAGE", "build_event", "build_event_series_patch", "build_object_reference"]

MAX_EVENT_MESSAGE = 1024
"""Characters of an Event's message kept; the API server refuses longer ones (and they are noise)."""


def build_object_reference(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj``'s reference (``apiVersion``, ``kind``, ``name``, ``namespace``, ``uid``), without absent fields."""
    meta = obj.get("metadata") or {}
    reference = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
    }
    return {key: value for key, value in reference.items() if value}


def build_event(
    involved: dict[str, Any],
    *,
    reason: str,
    message: str,
    now: dt.datetime,
    component: str,
    event_type: str = "Normal",
    count: int = 1,
    namespace: str | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about the object ``involved``, in ``namespace`` (default: the object's, else ``default``).

    Its name is generated from the object's (``<name>.<suffix>``); the first and last times are ``now``.
    """
    reference = build_object_reference(involved)
    stamp = format_timestamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "generateName": f"{reference.get('name') or component}.",
            "namespace": namespace or reference.get("namespace") or "default",
        },
        "involvedObject": reference,
        "reason": reason,
        "message": message[:MAX_EVENT_MESSAGE],
        "type": event_type,
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": count,
    }


def build_event_series_patch(*, count: int, message: str, now: dt.datetime) -> dict[str, Any]:
    """The merge patch that raises an Event's series: its ``count``, ``lastTimestamp`` and latest message."""
    return {"count": count, "lastTimestamp": format_timestamp(now), "message": message[:MAX_EVENT_MESSAGE]}
