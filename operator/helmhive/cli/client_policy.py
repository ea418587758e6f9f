"""Where the cluster commands' client points and how long it waits: kubectl's kubeconfig rules, the timeout, the words.

No ``kubernetes`` import (the client itself is :mod:`helmhive.cli.kubeapi`'s):

- the kubeconfig is found as kubectl finds it: ``--kubeconfig``, else ``$KUBECONFIG`` (one path
  or several separated by :data:`os.pathsep`, merged as kubectl merges them: the first file to
  set a value wins), else ``~/.kube/config``; without any, the pod's service account
  (:func:`kubeconfig_path`, :func:`decide_current_context`);
- the namespace without ``-n`` is the current context's, else the pod's, else ``default``
  (:func:`context_namespace`);
- every call waits :data:`DEFAULT_TIMEOUT_SECONDS` to connect and for each answer;
  ``$HELMHIVE_CLI_TIMEOUT_SECONDS`` (:data:`TIMEOUT_ENV`, :func:`decide_timeout`) overrides it;
  an answer asking to be retried is retried a few times, each wait capped (:func:`bounded_retries`);
- a call that got no answer, or only 429/5xx, is one line in words (:func:`describe_no_answer`,
  :func:`describe_unavailable`).
"""

from __future__ import annotations

import math
import os
import ssl
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import urllib3
import yaml

from helmhive.cli.render import printable

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "MAX_RETRY_WAIT_SECONDS",
    "MAX_TIMEOUT_SECONDS",
    "RETRIES",
    "SERVICE_ACCOUNT_NAMESPACE",
    "TIMEOUT_ENV",
    "bounded_retries",
    "context_namespace",
    "decide_current_context",
    "decide_namespace",
    "decide_timeout",
    "describe_no_answer",
    "describe_unavailable",
    "kubeconfig_files",
    "kubeconfig_path",
    "read_kubeconfigs",
    "server_address",
]

DEFAULT_TIMEOUT_SECONDS = 30.0
"""How long a call waits to connect, and then for each read, before giving up (kubectl gives up after ~50 s)."""
TIMEOUT_ENV = "HELMHIVE_CLI_TIMEOUT_SECONDS"
MAX_TIMEOUT_SECONDS = 3600.0
RETRIES = 3
"""How many more times a call is made when the server answers 429 or 503 with ``Retry-After``."""
MAX_RETRY_WAIT_SECONDS = 1.0
"""The longest wait before a retry, whatever ``Retry-After`` says (and at most a tenth of the timeout)."""
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
"""The pod's own namespace, used when there is no kubeconfig (as kubectl does in a pod)."""


def decide_namespace(*, context: Mapping[str, Any] | None, in_cluster: str | None) -> str:
    """kubectl's default namespace: the current context's; without a kubeconfig the pod's; else ``default``.

    ``context`` is the kubeconfig's current context entry (``{"name": …, "context": {…}}``), None
    when there is no kubeconfig; ``in_cluster`` the service-account namespace file's text. Pure.
    """
    if context is not None:
        inner = context.get("context")
        found = inner.get("namespace") if isinstance(inner, Mapping) else None
        return (found.strip() if isinstance(found, str) else "") or "default"
    return (in_cluster or "").strip() or "default"


def decide_current_context(configs: Sequence[object]) -> tuple[str | None, Mapping[str, Any]]:
    """kubectl's current context over the kubeconfig files, in order: its name and its entry (``{}`` if none).

    Merged as kubectl merges ``$KUBECONFIG``: the first file to set ``current-context`` wins, and
    so does the first context of a name. A part that is not what a kubeconfig holds is skipped. Pure.
    """
    docs = [doc for doc in configs if isinstance(doc, Mapping)]
    current = next((str(d["current-context"]) for d in docs if d.get("current-context")), None)
    for doc in docs:
        contexts = doc.get("contexts")
        for entry in contexts if isinstance(contexts, list) else []:
            if isinstance(entry, Mapping) and entry.get("name") == current:
                return current, entry
    return current, {}


def kubeconfig_path(kubeconfig: str | None) -> str | None:
    """The kubeconfig path(s) to read, or None when there is none (so the pod's identity is used)."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        return path
    try:
        default = Path.home() / ".kube" / "config"
    except (RuntimeError, KeyError):  # no home directory to look in
        return None
    return str(default) if default.exists() else None


def kubeconfig_files(path: str) -> list[Path]:
    """The files of ``path`` (``os.pathsep``-separated) that exist; kubectl skips the others."""
    files = []
    for one in filter(None, path.split(os.pathsep)):
        try:
            candidate = Path(one).expanduser()
        except RuntimeError:  # ~ with no home directory to expand it to
            continue
        if candidate.exists():
            files.append(candidate)
    return files


def read_kubeconfigs(path: str) -> list[object]:
    """Each existing file of ``path``, parsed; a YAML or decoding error propagates."""
    return [yaml.safe_load(one.read_text(encoding="utf-8")) for one in kubeconfig_files(path)]


def context_namespace(kubeconfig: str | None) -> str:
    """The namespace a command works in without ``-n``: see :func:`decide_namespace`."""
    path = kubeconfig_path(kubeconfig)
    if path is None:
        try:
            in_cluster: str | None = SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            in_cluster = None
        return decide_namespace(context=None, in_cluster=in_cluster)
    try:
        _, current = decide_current_context(read_kubeconfigs(path))
    except Exception:  # loading the client has reported an unreadable kubeconfig already
        return "default"
    return decide_namespace(context=current, in_cluster=None)


def decide_timeout(raw: str | None) -> float:
    """The call timeout from ``$HELMHIVE_CLI_TIMEOUT_SECONDS``'s text; ValueError says why it is unusable. Pure."""
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_TIMEOUT_SECONDS:  # NaN fails too
        raise ValueError(
            f"{TIMEOUT_ENV} must be a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS:g}, not {raw[:40]!r}"
        )
    return seconds


def server_address(host: str) -> str:
    """``host:port`` of the API server's URL, without credentials or path. Pure."""
    parts = urllib.parse.urlsplit(host if "//" in host else f"//{host}")
    try:
        hostname, port = parts.hostname or "", parts.port
    except ValueError:
        return printable(host, one_line=True)[:200]
    shown = f"[{hostname}]" if ":" in hostname else hostname
    return printable(f"{shown}:{port}" if port else shown, one_line=True)[:200]


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it wraps (``from``, ``during``, urllib3's ``reason`` and arguments)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        wrapped = [current.__cause__, current.__context__, getattr(current, "reason", None), *current.args]
        todo.extend(w for w in wrapped if isinstance(w, BaseException))


def _reason(chain: list[BaseException]) -> str:
    for exc in chain:
        if isinstance(exc, OSError) and (exc.strerror or exc.args):
            text = str(exc.strerror or exc.args[0])
            return text[:1].lower() + text[1:]
    return "no answer"


def describe_no_answer(exc: BaseException, *, server: str, timeout: float) -> str:
    """One line for a call that got no answer, naming the server and no exception class. Pure."""
    chain = list(_causes(exc))
    if any(isinstance(e, urllib3.exceptions.NameResolutionError) for e in chain):
        return f"the API server at {server} could not be reached: its host name does not resolve"
    if any(isinstance(e, urllib3.exceptions.NewConnectionError) for e in chain):  # before timeouts: a subclass
        return f"the API server at {server} could not be reached: {_reason(chain)}"
    if any(isinstance(e, (urllib3.exceptions.TimeoutError, TimeoutError)) for e in chain):
        return f"the API server did not answer within {timeout:g} s ({server})"
    verify = next((str(e.verify_message) for e in chain if isinstance(e, ssl.SSLCertVerificationError)), None)
    if verify or any(isinstance(e, urllib3.exceptions.SSLError) for e in chain):
        detail = f": {verify}" if verify else ""
        return f"the API server at {server} could not be reached: the TLS handshake failed{detail}"
    return f"the API server at {server} could not be reached: {_reason(chain)}"


def describe_unavailable(status: int, message: str) -> str:
    """One line for a call the API server answered 429 or 5xx (its retries spent): it answered, and what. Pure."""
    said = {429: "that it is busy", 503: "that it is unavailable"}.get(status, "with an error")
    return f"the API server answered {said}: {status} {message}".rstrip()


class _BoundedRetry(urllib3.Retry):
    """urllib3's ``Retry``, but a server's ``Retry-After`` is waited for at most ``backoff_max`` seconds.

    urllib3 honours ``Retry-After`` with no cap (six hours); a header it cannot read is waited
    ``backoff_max`` too, not raised. ``urllib3.Retry.new`` rebuilds this class with the same fields.
    """

    def parse_retry_after(self, retry_after: str) -> float:
        try:
            asked = super().parse_retry_after(retry_after)
        except urllib3.exceptions.InvalidHeader:
            asked = self.backoff_max
        return min(asked, self.backoff_max)


def bounded_retries(timeout: float) -> urllib3.Retry:
    """The client's retries: an answer that asks for one (429, 503 with ``Retry-After``, on a read), no more.

    Up to :data:`RETRIES` of them, each after the wait the server asks for but at most
    ``min(MAX_RETRY_WAIT_SECONDS, timeout / 10)``: all of them together wait less than a third of
    the timeout. No answer is not retried, so a silent server costs one timeout, not four. Pure.
    """
    wait = min(MAX_RETRY_WAIT_SECONDS, timeout / 10)
    return _BoundedRetry(
        total=RETRIES, connect=0, read=0, other=0, status=RETRIES, raise_on_status=False, backoff_max=wait
    )
