"""A fake provider API on loopback, over TLS with a certificate authority of its own.

It stands where ``api.anthropic.com`` would: the egress proxy forwards to it and must verify its
certificate against the CA file the test hands the proxy (``egress.caBundle``). It records each
request's method, path and what its auth headers held -- classified as ``canary`` (the real key),
``placeholder`` or ``other`` -- never the values themselves, so no failing assertion can print a
credential. ``POST /v1/messages`` answers with the Messages API's server-sent events in two parts: the second only
after :attr:`FakeProvider.release` is set, which shows whether a proxy streams or buffers.

Just enough of two more APIs to answer the first request of the real Gemini and Codex CLIs with
:data:`ANSWER`: Gemini's ``POST /v1beta/models/<model>:generateContent`` (JSON) and
``:streamGenerateContent?alt=sse`` (server-sent events; the unstreamed call is the CLI's model
router asking for a complexity score, answered with one), and OpenAI's Responses API,
``POST /v1/responses`` (server-sent events). Codex first asks for a WebSocket on
``GET /v1/responses``; that, like every other ``GET``, gets a plain JSON 200, not a ``101``.
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from helmhive.devcluster.pki import build_ca, build_serving_cert
from helmhive.runner.egress.proxy import PLACEHOLDER

AUTH = ("authorization", "x-api-key", "x-goog-api-key", "api-key")
ANSWER = "hello from the fake provider"
_MESSAGE_EVENTS: list[dict[str, Any]] = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ANSWER}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 5},
    },
    {"type": "message_stop"},
]
"""The Anthropic Messages API's streaming events for a one-line answer."""


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


_GEMINI_RESPONSE: dict[str, Any] = {
    "candidates": [{"content": {"role": "model", "parts": [{"text": ANSWER}]}, "finishReason": "STOP", "index": 0}],
    "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 5, "totalTokenCount": 6},
    "modelVersion": "gemini-2.5-flash",
}
"""A ``GenerateContentResponse``: the whole answer, or the one event of a stream."""

_USAGE = {
    "input_tokens": 1,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 5,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 6,
}
_RESPONSES_EVENTS: list[dict[str, Any]] = [
    {"type": "response.created", "response": {"id": "resp_fake", "status": "in_progress"}},
    {
        "type": "response.output_item.done",
        "output_index": 0,
        "item": {
            "type": "message",
            "id": "msg_fake",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
        },
    },
    {"type": "response.completed", "response": {"id": "resp_fake", "status": "completed", "usage": _USAGE}},
]
"""OpenAI's Responses API streaming events for a one-message answer."""


def _answer(path: str) -> tuple[str, bytes]:
    """The content type and body that answer a model request to ``path`` (query string included)."""
    if ":streamGenerateContent" in path:
        return "text/event-stream", f"data: {json.dumps(_GEMINI_RESPONSE)}\n\n".encode()
    if ":generateContent" in path:  # Gemini CLI's model router, which wants a JSON verdict
        verdict = json.dumps({"complexity_reasoning": "a greeting", "complexity_score": 1})
        routed = {
            **_GEMINI_RESPONSE,
            "candidates": [
                {**_GEMINI_RESPONSE["candidates"][0], "content": {"role": "model", "parts": [{"text": verdict}]}}
            ],
        }
        return "application/json", json.dumps(routed).encode()
    return "text/event-stream", b"".join(_sse(event) for event in _RESPONSES_EVENTS)


@dataclass
class Seen:
    method: str
    path: str
    auth: dict[str, str]
    """Auth header (or ``query:key``) -> ``canary``, ``placeholder`` or ``other``."""
    host: str


@dataclass
class FakeProvider:
    url: str
    ca_file: Path
    canary: str
    requests: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def classify(self, value: str) -> str:
        if self.canary in value:
            return "canary"
        return "placeholder" if PLACEHOLDER in value else "other"


def write_ca_pair(directory: Path, *, name: str) -> tuple[Path, ssl.SSLContext]:
    """A fresh CA (its certificate in ``<name>-ca.crt``) and a server context for 127.0.0.1 it signed."""
    now = dt.datetime.now(dt.UTC)
    ca = build_ca(common_name=f"{name}-ca", now=now)
    leaf = build_serving_cert(ca, common_name=name, dns_names=("localhost",), ip_addresses=("127.0.0.1",), now=now)
    directory.mkdir(parents=True, exist_ok=True)
    ca_file, cert_file, key_file = (directory / f"{name}-{part}" for part in ("ca.crt", "tls.crt", "tls.key"))
    ca_file.write_bytes(ca.cert_pem)
    cert_file.write_bytes(leaf.cert_pem)
    key_file.write_bytes(leaf.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return ca_file, context


@contextmanager
def fake_provider(directory: Path, *, canary: str) -> Iterator[FakeProvider]:
    ca_file, context = write_ca_pair(directory, name="fake-provider")
    holder: dict[str, FakeProvider] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the test reads what it needs
            return

        def _record(self) -> FakeProvider:
            provider = holder["p"]
            auth = {name: provider.classify(self.headers[name]) for name in AUTH if self.headers.get(name)}
            if "key=" in self.path:
                auth["query:key"] = provider.classify(self.path)
            path = self.path.split("?", 1)[0]
            provider.requests.append(Seen(self.command, path, auth, self.headers.get("host", "")))
            return provider

        def do_GET(self) -> None:
            self._record()
            body = b'{"ok":true}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            provider = self._record()
            length = int(self.headers.get("content-length", "0"))
            self.rfile.read(length)
            if not self.path.startswith("/v1/messages"):
                content_type, body = _answer(self.path)
                self.send_response(200)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            first, *rest = _MESSAGE_EVENTS
            self.wfile.write(_sse(first))
            self.wfile.flush()
            provider.release.wait(30)
            self.wfile.write(b"".join(_sse(event) for event in rest))
            self.wfile.flush()
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    port = server.server_address[1]
    holder["p"] = FakeProvider(url=f"https://127.0.0.1:{port}", ca_file=ca_file, canary=canary)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder["p"]
    finally:
        holder["p"].release.set()
        server.shutdown()
        server.server_close()
