"""The CLI's door to the Kubernetes API: loading a client, the calls commands make, reporting errors.

In ``helmhive.cli`` only this module imports the ``kubernetes`` client. :class:`CliKube` offers the
few synchronous calls ``change`` and ``sessions`` make -- custom objects (get, list, merge patch of
the object or its status), a ConfigMap's data, removing one key of a Secret, and who the caller is
-- and raises only the error tree of :mod:`helmhive.api.kubeerrors`, as the operator's and the
runner's doors do. ``explain-routing`` makes its calls through the operator's door
(``helmhive.controller.kube``) on a client loaded here (:func:`load_api_client`).

The kubeconfig is found as kubectl finds it: ``--kubeconfig``, else ``$KUBECONFIG`` (one path or
several separated by :data:`os.pathsep`, merged as kubectl merges them: the first file to set a
value wins), else ``~/.kube/config``; without any, the pod's service account. The namespace a
command works in without ``-n`` is the current context's, else the pod's, else ``default``
(:func:`context_namespace`). A kubeconfig that cannot be loaded is reported in one line that quotes
nothing from the file (:func:`describe_kubeconfig_error`): a broken line may hold a token.

Every call is bounded: a connect and a read timeout of :data:`DEFAULT_TIMEOUT_SECONDS`;
``$HELMHIVE_CLI_TIMEOUT_SECONDS`` (:data:`TIMEOUT_ENV`, read by :func:`decide_timeout` for every
command) overrides it. One attempt, unless the server answers 429 or 503 with ``Retry-After``: then
up to three more, each after the wait it asks for but never more than a tenth of the timeout (at
most a second), so a ``Retry-After: 60`` cannot hold a command for minutes (:func:`bounded_retries`).
A call that gets no answer is an ``Unavailable`` whose message says so in words
(:func:`describe_no_answer`); one whose answer stays 429 or 5xx after its retries says that the
server answered, and what (:func:`describe_unavailable`).

A failure is printed as one red line (``<what>: [<status>] <message>``; for 429 and 5xx
``<what>: the API server answered that it is busy: 429 <message>`` or the like) and exits
non-zero; no command prints a stack trace for a user's mistake, a refused request or a silent server. Text read
from objects is shown through :mod:`helmhive.cli.render`.
"""

from __future__ import annotations

import enum
import math
import os
import ssl
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

import typer
import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from helmhive.api.audit import AuditActor
from helmhive.api.kinds import GROUP, VERSION
from helmhive.api.kubeerrors import KubeError, Unavailable
from helmhive.cli.render import describe_yaml_error, fail, printable
from helmhive.kubeclient import NETWORK_ERRORS, throttle_credential_refresh, translate_api_error

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "SERVICE_ACCOUNT_NAMESPACE",
    "TIMEOUT_ENV",
    "CliKube",
    "KubeconfigError",
    "KubeconfigOption",
    "NamespaceOption",
    "OutputFormat",
    "OutputOption",
    "api_error",
    "bounded_retries",
    "context_namespace",
    "decide_current_context",
    "decide_namespace",
    "decide_timeout",
    "describe_kubeconfig_error",
    "describe_no_answer",
    "describe_unavailable",
    "load_api",
    "load_api_client",
    "server_address",
    "whoami",
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


class OutputFormat(enum.StrEnum):
    TABLE = "table"
    JSON = "json"


KubeconfigOption = Annotated[str | None, typer.Option(envvar="KUBECONFIG", help="Kubeconfig to use.")]
NamespaceOption = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="Namespace of the object (default: the kubeconfig context's)."),
]
OutputOption = Annotated[OutputFormat, typer.Option("--output", "-o", metavar="table|json", help="table or json")]
T = TypeVar("T")


# Namespace, timeout, server -------------------------------------------------------------------
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


def _kubeconfig_path(kubeconfig: str | None) -> str | None:
    """The kubeconfig path(s) to read, or None when there is none (so the pod's identity is used)."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        return path
    try:
        default = Path.home() / ".kube" / "config"
    except (RuntimeError, KeyError):  # no home directory to look in
        return None
    return str(default) if default.exists() else None


def _kubeconfig_files(path: str) -> list[Path]:
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


def _read_kubeconfigs(path: str) -> list[object]:
    """Each existing file of ``path``, parsed; a YAML or decoding error propagates."""
    return [yaml.safe_load(one.read_text(encoding="utf-8")) for one in _kubeconfig_files(path)]


def context_namespace(kubeconfig: str | None) -> str:
    """The namespace a command works in without ``-n``: see :func:`decide_namespace`."""
    path = _kubeconfig_path(kubeconfig)
    if path is None:
        try:
            in_cluster: str | None = SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            in_cluster = None
        return decide_namespace(context=None, in_cluster=in_cluster)
    try:
        _, current = decide_current_context(_read_kubeconfigs(path))
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


# The calls ------------------------------------------------------------------------------------
class CliKube:
    """The CLI's API calls, synchronous. Every method may raise a :class:`~helmhive.api.kubeerrors.KubeError`."""

    def __init__(self, api_client: Any, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.api_client = api_client
        self.timeout = timeout
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, _request_timeout=(self.timeout, self.timeout), **kwargs)
        except NETWORK_ERRORS as exc:
            if isinstance(exc, ApiException) and exc.status:
                raise translate_api_error(exc) from exc
            server = server_address(str(self.api_client.configuration.host))
            raise Unavailable(0, describe_no_answer(exc, server=server, timeout=self.timeout)) from exc

    # Custom objects (``plural`` of the helmhive.dev group) ---------------------------------
    def get(self, plural: str, name: str, namespace: str) -> dict[str, Any]:
        result = self._call(self._custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name)
        return cast(dict[str, Any], result)

    def list(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        result = self._call(self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural)
        return list(cast(dict[str, Any], result).get("items", []))

    def patch(self, plural: str, name: str, namespace: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the object; ``metadata.resourceVersion`` in ``patch`` makes it conditional."""
        return self._merge_patch(self._custom.patch_namespaced_custom_object, plural, name, namespace, patch)

    def patch_status(self, plural: str, name: str, namespace: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status subresource; ``metadata.resourceVersion`` makes it conditional."""
        return self._merge_patch(self._custom.patch_namespaced_custom_object_status, plural, name, namespace, patch)

    def _merge_patch(
        self, method: Any, plural: str, name: str, namespace: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        result = self._call(
            method, GROUP, VERSION, namespace, plural, name, patch, _content_type="application/merge-patch+json"
        )
        return cast(dict[str, Any], result)

    # Core objects ----------------------------------------------------------------------
    def config_map_data(self, name: str, namespace: str) -> dict[str, str]:
        config_map = self._call(self._core.read_namespaced_config_map, name, namespace)
        return {str(k): str(v) for k, v in (config_map.data or {}).items()}

    def remove_secret_key(self, name: str, namespace: str, key: str) -> None:
        """Remove ``data[key]`` from a Secret (a JSON patch: NotFound without the Secret, Invalid without the key)."""
        self._call(
            self._core.patch_namespaced_secret,
            name,
            namespace,
            [{"op": "remove", "path": f"/data/{key}"}],
            _content_type="application/json-patch+json",
        )

    def whoami(self) -> AuditActor:
        """The caller as the API server identifies them (SelfSubjectReview); ``unknown`` if it cannot say."""
        try:
            review = self._call(
                client.AuthenticationV1Api(self.api_client).create_self_subject_review,
                client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"),
            )
        except KubeError:
            return AuditActor(username="unknown")
        info = review.status.user_info if review.status is not None else None
        if info is None:
            return AuditActor(username="unknown")
        return AuditActor(
            username=info.username or "unknown", uid=info.uid or None, groups=list(info.groups or [])[:16]
        )


# Loading a client ------------------------------------------------------------------------------
class KubeconfigError(Exception):
    """No client could be loaded; the message is one line that quotes nothing from the file."""


def describe_kubeconfig_error(err: BaseException, *, path: str | None) -> str:
    """Why the kubeconfig at ``path`` (None: none, and the pod's identity failed) could not be loaded. Pure.

    A YAML error is named by its position and problem only: PyYAML's own message quotes the
    broken line, which may hold a token.
    """
    if isinstance(err, yaml.YAMLError):
        reason = describe_yaml_error(err)
    elif isinstance(err, UnicodeDecodeError):
        reason = f"not UTF-8 text (byte {err.start}: {err.reason})"
    elif isinstance(err, config.ConfigException):  # the loader's own words
        reason = str(err)
    elif isinstance(err, OSError):
        reason = str(err.strerror or err)
    else:  # a file of another shape: a list, a base64 field that is not base64, ...
        reason = f"not a valid kubeconfig: {err or type(err).__name__}"
    if path is None:
        return f"no --kubeconfig, $KUBECONFIG or ~/.kube/config, and not in a cluster ({reason})"
    return f"{path}: {reason}"


def load_api_client(kubeconfig: str | None, *, timeout: float | None = None) -> Any:
    """An ``ApiClient`` from the kubeconfig kubectl would use, else the pod's identity; else :class:`KubeconfigError`.

    An answer asking to be retried is retried, within ``timeout`` (:func:`bounded_retries`; None:
    ``$HELMHIVE_CLI_TIMEOUT_SECONDS``'s, else the default). The calls' own timeouts are the
    caller's. The credentials are read again at most once a second
    (:func:`~helmhive.kubeclient.throttle_credential_refresh`).
    """
    if timeout is None:
        try:
            timeout = decide_timeout(os.environ.get(TIMEOUT_ENV))
        except ValueError:  # the command reports it; the retries need only a bound
            timeout = DEFAULT_TIMEOUT_SECONDS
    path = _kubeconfig_path(kubeconfig)
    if path is not None and not _kubeconfig_files(path):
        raise KubeconfigError(f"{path}: no such file")
    configuration = client.Configuration()
    try:
        if path is None:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            context, _ = decide_current_context(_read_kubeconfigs(path))
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=configuration
            )
    except Exception as err:  # the loader raises ConfigException, binascii.Error, TypeError, ...: all mean the same
        raise KubeconfigError(describe_kubeconfig_error(err, path=path)) from None
    configuration.retries = bounded_retries(timeout)
    throttle_credential_refresh(configuration)
    return client.ApiClient(configuration)


def load_api(kubeconfig: str | None) -> CliKube:
    """The CLI's door (:func:`load_api_client`), each call bounded by :func:`decide_timeout`; exit 2 with a reason."""
    try:
        timeout = decide_timeout(os.environ.get(TIMEOUT_ENV))
    except ValueError as err:
        raise fail(str(err), 2) from None
    try:
        return CliKube(load_api_client(kubeconfig, timeout=timeout), timeout=timeout)
    except KubeconfigError as err:
        raise fail(f"cannot load kubeconfig: {err}", 2) from None


def api_error(err: KubeError, what: str) -> typer.Exit:
    """Print the API server's own message (or why there was none) for a failed call; return the Exit to raise."""
    if isinstance(err, Unavailable) and err.status:  # 429 or 5xx: it did answer, after the retries too
        return fail(f"{what}: {describe_unavailable(err.status, err.message)}", 1)
    status = f"{err.status} " if err.status else ""
    return fail(f"{what}: {status}{err.message}", 1)


def whoami(api: CliKube) -> AuditActor:
    """The caller as the API server identifies them; see :meth:`CliKube.whoami`."""
    return api.whoami()
