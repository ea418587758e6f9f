"""The job pod link's framing and authentication, pure (no processes)."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from helmhive.api.governed import CheckOutcome
from helmhive.runner.jobpod import auth
from helmhive.runner.jobpod.frames import (
    HEADER,
    MAX_PAYLOAD,
    PROTOCOL_VERSION,
    AuthOk,
    CheckReport,
    Frame,
    FrameType,
    Hello,
    LinkError,
    Start,
    decode,
    encode_frame,
    expect,
    read_frame,
)


async def _read(data: bytes) -> Frame:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return await read_frame(reader)


async def _reason(data: bytes) -> str:
    with pytest.raises(LinkError) as failed:
        await _read(data)
    return failed.value.reason


async def test_frames_round_trip() -> None:
    start = Start(argv=["agent", "--flag"], env={"K": "v"}, cwd="/job/workspace", egress_target="127.0.0.1:7471")
    frame = await _read(encode_frame(FrameType.START, start))
    assert decode(frame, Start) == start
    assert b'"egressTarget"' in frame.payload  # camelCase on the wire
    data = await _read(encode_frame(FrameType.DATA, b"\x00\xff" * 10))
    assert (data.type, data.payload) == (FrameType.DATA, b"\x00\xff" * 10)
    assert (await _read(encode_frame(FrameType.END))).payload == b""


async def test_bad_frames_are_named() -> None:
    assert await _reason(b"") == "closed"
    assert await _reason(HEADER.pack(FrameType.DATA, 10)[:3]) == "eof"
    assert await _reason(HEADER.pack(FrameType.DATA, 10) + b"short") == "eof"
    assert await _reason(HEADER.pack(FrameType.DATA, MAX_PAYLOAD + 1)) == "oversize"
    assert await _reason(HEADER.pack(200, 0)) == "unknown-type"
    assert await _reason(HEADER.pack(FrameType.END, 1) + b"x") == "bad-frame"
    with pytest.raises(LinkError) as oversize:
        encode_frame(FrameType.STDOUT, b"x" * (MAX_PAYLOAD + 1))
    assert oversize.value.reason == "oversize"
    with pytest.raises(LinkError) as raw_control:
        encode_frame(FrameType.START, b"{}")
    assert raw_control.value.reason == "bad-frame"


async def test_a_bad_payload_names_fields_never_values() -> None:
    frame = Frame(FrameType.START, b'{"argv": [], "env": {"KEY": 12345678}, "cwd": "/", "extra": "sekrit-value"}')
    with pytest.raises(LinkError) as bad:
        decode(frame, Start)
    assert bad.value.reason == "bad-payload"
    assert "argv" in bad.value.message and "extra" in bad.value.message
    assert "12345678" not in bad.value.message and "sekrit-value" not in bad.value.message
    with pytest.raises(LinkError) as not_json:
        decode(Frame(FrameType.START, b"\xff not json"), Start)
    assert not_json.value.reason == "bad-payload"


def test_an_error_frame_is_raised_with_the_peers_reason() -> None:
    error = Frame(FrameType.ERROR, b'{"reason": "claimed", "message": "taken"}')
    with pytest.raises(LinkError) as raised:
        expect(error, FrameType.OK)
    assert (raised.value.reason, raised.value.message) == ("claimed", "taken")
    with pytest.raises(LinkError) as unexpected:
        expect(Frame(FrameType.DATA, b""), FrameType.OK)
    assert unexpected.value.reason == "unexpected"


def test_mutual_authentication_and_the_claim() -> None:
    key = secrets.token_bytes(32)
    hello = Hello(nonce=auth.new_nonce(), pod="pod-1", state="idle", protocol=PROTOCOL_VERSION)
    request = auth.answer_hello(key=key, hello=hello, pod="pod-1", job_uid="job-1")
    verdict = auth.judge_auth(key=key, hello=hello, auth=request, claimed_by=None)
    assert verdict.job_uid == "job-1" and verdict.ok is not None and verdict.error is None
    auth.verify_auth_ok(key=key, hello=hello, auth=request, ok=verdict.ok)
    # The same uid again is fine; another is refused; a wrong key is refused either way.
    assert auth.judge_auth(key=key, hello=hello, auth=request, claimed_by="job-1").job_uid == "job-1"
    other = auth.answer_hello(key=key, hello=hello, pod="pod-1", job_uid="job-2")
    claimed = auth.judge_auth(key=key, hello=hello, auth=other, claimed_by="job-1")
    assert claimed.error is not None and claimed.error.reason == "claimed"
    forged = auth.answer_hello(key=secrets.token_bytes(32), hello=hello, pod="pod-1", job_uid="job-1")
    refused = auth.judge_auth(key=key, hello=hello, auth=forged, claimed_by=None)
    assert refused.error is not None and refused.error.reason == "auth" and refused.ok is None
    # A proof is bound to its nonce and pod: it does not answer another HELLO.
    replayed = Hello(nonce=auth.new_nonce(), pod="pod-1", state="idle", protocol=PROTOCOL_VERSION)
    assert auth.judge_auth(key=key, hello=replayed, auth=request, claimed_by=None).error is not None
    # The runner checks the shim's proof, and which pod it reached.
    impostor = AuthOk(mac=auth.shim_mac(secrets.token_bytes(32), request.nonce, "pod-1"))
    with pytest.raises(LinkError) as unproven:
        auth.verify_auth_ok(key=key, hello=hello, auth=request, ok=impostor)
    assert unproven.value.reason == "auth"
    with pytest.raises(LinkError) as elsewhere:
        auth.answer_hello(key=key, hello=hello, pod="pod-2", job_uid="job-1")
    assert elsewhere.value.reason == "pod-mismatch"
    assert auth.runner_mac(key, hello.nonce, "pod-1") != auth.shim_mac(key, hello.nonce, "pod-1")


def test_a_check_result_maps_onto_evidence() -> None:
    sha = "a" * 64
    timed_out = CheckReport(
        name="c", exit_code=None, duration_ms=2500, timed_out=True, output_bytes=5, output_sha256=sha
    )
    evidence = timed_out.to_evidence()
    assert (evidence.outcome, evidence.exit_code, evidence.duration_seconds) == (CheckOutcome.TIMED_OUT, None, 2.5)
    launcher = CheckReport(name="c", exit_code=126, output_tail="helmhive sandbox: no", not_run="refused")
    assert (launcher.to_evidence().outcome, launcher.to_evidence().exit_code) == (CheckOutcome.NOT_RUN, 126)
    failed = CheckReport(name="c", exit_code=1, output_tail="x", output_bytes=1, output_sha256=sha)
    assert failed.to_evidence().model_dump() == {
        "name": "c",
        "outcome": CheckOutcome.FAILED,
        "exit_code": 1,
        "duration_seconds": 0.0,
        "output_tail": "x",
        "output_bytes": 1,
        "output_sha256": sha,
    }
