"""A deterministic Anthropic Messages API on loopback, for driving the real Claude CLI through turns.

The real ``claude`` binary is pointed at it with ``ANTHROPIC_BASE_URL`` (plain HTTP on 127.0.0.1,
or HTTPS behind the runner's egress proxy) and a dummy ``ANTHROPIC_API_KEY``, so a CLI turn --
and the CLI's own ``/compact`` -- runs end to end without a login or the network. Its usage
figures follow from what the CLI sends, as a real provider's do: every text block of the request
counts ``len(text) // 4`` tokens, except that a text holding ``PAD <n>`` counts ``n``. A history
that is resumed grows; one the CLI has summarised shrinks.

A request whose system prompt or messages ask for a conversation summary (the CLI's compaction
prompt) is answered according to :attr:`FakeMessagesApi.compact`: ``ok`` (a short summary),
``error`` (HTTP 400, which the CLI does not retry) or ``hang`` (headers, then nothing until the
test ends). Every other request gets a one-line answer. Each request is recorded by kind, the
usage it was answered with and which watched strings it held; the API key is classified
(``expected``/``other``), never stored.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .fake_provider import write_ca_pair

ANSWER = "fake-messages-api answer"
SUMMARY = "<summary>The user asked for short answers; nothing is pending.</summary>"
SUMMARY_MARK = "create a detailed summary of the conversation"
_PAD = re.compile(r"\bPAD (\d{1,9})\b")


def count_tokens(value: Any) -> int:
    """The deterministic token count of a request's ``system`` or ``messages`` value."""
    if isinstance(value, str):
        pads = _PAD.findall(value)
        return sum(int(p) for p in pads) if pads else len(value) // 4
    if isinstance(value, list):
        return sum(count_tokens(item) for item in value)
    if isinstance(value, dict):
        if value.get("type") == "text" or "text" in value:
            return count_tokens(value.get("text", ""))
        if "content" in value:
            return count_tokens(value["content"])
    return 0


@dataclass(frozen=True)
class Seen:
    kind: str
    """``summary`` (the CLI's compaction prompt), ``turn`` or ``count_tokens``/``other`` for other paths."""
    input_tokens: int
    key: str
    found: tuple[str, ...] = ()
    """Which of :attr:`FakeMessagesApi.watch` the request's body held."""


@dataclass
class FakeMessagesApi:
    url: str
    api_key: str
    ca_file: Path | None = None
    """With TLS: the certificate authority that signed the server's certificate."""
    compact: str = "ok"
    watch: tuple[str, ...] = ()
    requests: list[Seen] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def kinds(self) -> list[str]:
        return [seen.kind for seen in self.requests]


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def _message_events(*, text: str, input_tokens: int, model: str) -> list[dict[str, Any]]:
    usage = {"input_tokens": input_tokens, "output_tokens": 1, "cache_read_input_tokens": 0}
    return [
        {
            "type": "message_start",
            "message": {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": max(len(text) // 4, 1)},
        },
        {"type": "message_stop"},
    ]


@contextmanager
def fake_messages_api(*, api_key: str, tls_dir: Path | None = None) -> Iterator[FakeMessagesApi]:
    """Serve on 127.0.0.1: plain HTTP, or with ``tls_dir`` HTTPS with a CA of its own (for the egress proxy)."""
    holder: dict[str, FakeMessagesApi] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the test reads what it needs
            return

        def _json(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._json(200, {"data": [], "has_more": False})

        def do_POST(self) -> None:
            api = holder["api"]
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            try:
                body = json.loads(raw)
            except ValueError:
                body = {}
            key = "expected" if self.headers.get("x-api-key") == api.api_key else "other"
            path = self.path.split("?", 1)[0]
            tokens = count_tokens(body.get("system")) + count_tokens(body.get("messages"))
            if path.endswith("/count_tokens"):
                api.requests.append(Seen("count_tokens", tokens, key))
                self._json(200, {"input_tokens": tokens})
                return
            if path != "/v1/messages":
                api.requests.append(Seen("other", tokens, key))
                self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
                return
            text = raw.decode("utf-8", "replace")
            summary = SUMMARY_MARK in text
            found = tuple(mark for mark in api.watch if mark in text)
            api.requests.append(Seen("summary" if summary else "turn", tokens, key, found))
            if summary and api.compact == "error":
                error = {"type": "invalid_request_error", "message": "compaction refused by the fake provider"}
                self._json(400, {"type": "error", "error": error})
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            if summary and api.compact == "hang":
                self.wfile.flush()
                api.stop.wait(120)
                self.close_connection = True
                return
            model = str(body.get("model") or "claude-sonnet-4-5")
            events = _message_events(text=SUMMARY if summary else ANSWER, input_tokens=tokens, model=model)
            self.wfile.write(b"".join(_sse(event) for event in events))
            self.wfile.flush()
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    ca_file = None
    if tls_dir is not None:
        ca_file, context = write_ca_pair(tls_dir, name="fake-messages-api")
        server.socket = context.wrap_socket(server.socket, server_side=True)
    scheme = "https" if ca_file else "http"
    port = server.server_address[1]
    holder["api"] = FakeMessagesApi(url=f"{scheme}://127.0.0.1:{port}", api_key=api_key, ca_file=ca_file)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder["api"]
    finally:
        holder["api"].stop.set()
        server.shutdown()
        server.server_close()
