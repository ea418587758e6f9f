"""Mutual authentication on the job pod link, with the pool's link key. Pure but for HMAC and randomness.

The shim speaks first: ``HELLO {nonce, pod, state, protocol}``. The runner proves it holds the
key with ``AUTH {nonce, mac = HMAC-SHA256(key, "runner|" + shim nonce + "|" + pod), jobUid}``;
the shim checks it in constant time and proves the same with
``AUTH_OK {mac = HMAC-SHA256(key, "shim|" + runner nonce + "|" + pod)}``. Each side's nonce is
fresh per connection, so neither proof can be replayed to another connection or another pod.

The first authenticated job uid claims the pod (:func:`judge_auth`); later connections must
present the same uid. A peer that fails gets ``ERROR auth`` (or ``claimed``) and nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path

from helmhive.runner.jobpod.frames import (
    PROTOCOL_VERSION,
    Auth,
    AuthOk,
    ErrorPayload,
    Hello,
    LinkError,
    LinkReason,
)

__all__ = [
    "MIN_KEY_BYTES",
    "AuthVerdict",
    "answer_hello",
    "judge_auth",
    "new_nonce",
    "read_key",
    "runner_mac",
    "shim_mac",
    "verify_auth_ok",
]

MIN_KEY_BYTES = 16
NONCE_BYTES = 16


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def read_key(path: str | Path) -> bytes:
    """The link key's bytes, exactly as stored (never logged, never in an error message)."""
    try:
        key = Path(path).read_bytes()
    except OSError as exc:
        raise LinkError(LinkReason.KEY, f"cannot read the link key file: {exc.strerror or exc}") from None
    if len(key) < MIN_KEY_BYTES:
        raise LinkError(LinkReason.KEY, f"the link key file holds fewer than {MIN_KEY_BYTES} bytes")
    return key


def _mac(key: bytes, role: str, nonce: str, pod: str) -> str:
    return hmac.new(key, f"{role}|{nonce}|{pod}".encode(), hashlib.sha256).hexdigest()


def runner_mac(key: bytes, shim_nonce: str, pod: str) -> str:
    return _mac(key, "runner", shim_nonce, pod)


def shim_mac(key: bytes, runner_nonce: str, pod: str) -> str:
    return _mac(key, "shim", runner_nonce, pod)


def answer_hello(*, key: bytes, hello: Hello, pod: str, job_uid: str) -> Auth:
    """The runner's AUTH for ``hello``, after checking that it is the pod it meant to reach."""
    if hello.protocol != PROTOCOL_VERSION:
        raise LinkError(LinkReason.VERSION, f"the shim speaks protocol {hello.protocol}, not {PROTOCOL_VERSION}")
    if hello.pod != pod:
        raise LinkError(LinkReason.POD, f"reached pod {hello.pod!r}, not {pod!r}")
    return Auth(nonce=new_nonce(), mac=runner_mac(key, hello.nonce, pod), job_uid=job_uid)


def verify_auth_ok(*, key: bytes, hello: Hello, auth: Auth, ok: AuthOk) -> None:
    """Raise unless the shim proved it holds the key (for this connection's nonce and pod)."""
    if not hmac.compare_digest(shim_mac(key, auth.nonce, hello.pod), ok.mac):
        raise LinkError(LinkReason.AUTH, "the shim did not prove it holds the pool's link key")


@dataclass(frozen=True, slots=True)
class AuthVerdict:
    """The shim's answer to one AUTH: the reply to send, and on success the job uid that holds the pod."""

    job_uid: str | None
    ok: AuthOk | None
    error: ErrorPayload | None


def judge_auth(*, key: bytes, hello: Hello, auth: Auth, claimed_by: str | None) -> AuthVerdict:
    """Check the runner's proof (constant time), then the claim: the first job uid holds the pod."""
    if not hmac.compare_digest(runner_mac(key, hello.nonce, hello.pod), auth.mac):
        return AuthVerdict(None, None, ErrorPayload(reason=LinkReason.AUTH, message="authentication failed"))
    if claimed_by is not None and not hmac.compare_digest(claimed_by.encode(), auth.job_uid.encode()):
        error = ErrorPayload(reason=LinkReason.CLAIMED, message="this pod is claimed by another job")
        return AuthVerdict(None, None, error)
    return AuthVerdict(auth.job_uid, AuthOk(mac=shim_mac(key, auth.nonce, hello.pod)), None)
