"""The console's HTTP server: the standard library's threading server on 127.0.0.1, one port, one user.

Owns the routes, the access token and the headers. The console acts with the kubeconfig of the
person who started it, so it must not act for anyone else who can reach the port:

* the URL it prints carries a random token; ``/login?token=…`` turns it into an ``HttpOnly``,
  ``SameSite=Strict`` cookie, and every other route needs that cookie (another local user, or a
  web page in the same browser, cannot use the console);
* the ``Host`` header must name the loopback address and port (no DNS rebinding), and a POST's
  ``Origin``, when sent, must be the console's own;
* a strict Content-Security-Policy allows only the package's own script and style sheet.

Routes: ``/`` (the overview), ``/memory`` (the namespace's memory records), ``/profiles`` (each
profile beside its envelope, and its revisions), ``/audit`` (the AuditRecords; the search is its
query string, kept when the page refreshes itself), ``/jobs/NS/NAME``,
``/changes/NS/NAME`` (and its ``/patch``, the raw bytes; POST ``/approve``), ``/api/…`` (the same
page models as JSON), ``/events`` (Server-Sent Events from :class:`~helmhive.console.hub.Hub`, only
what concerns the page: ``?watches=``, :func:`decide_watches`) and ``/static/…``. ``?fragment=1``
answers a page's ``<main>`` body only: the page's script asks for it when a watch event arrives.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import queue
import secrets
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from helmhive.console import html
from helmhive.console.hub import Hub
from helmhive.console.pages import Answer, Pages

__all__ = ["ConsoleServer", "make_server"]

COOKIE = "helmhive_console"
STATIC = {"console.js": "text/javascript", "console.css": "text/css"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
KEEPALIVE_SECONDS = 15.0


class ConsoleServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, *, pages: Pages, hub: Hub, token: str) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.pages, self.hub, self.token = pages, hub, token

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/login?token={self.token}"


def make_server(port: int, *, pages: Pages, hub: Hub) -> ConsoleServer:
    return ConsoleServer(port, pages=pages, hub=hub, token=secrets.token_urlsafe(32))


def decide_watches(path: str) -> str:
    """What a page is refreshed on, for ``/events?watches=…``: ``kind`` or ``kind:name``, comma-separated. Pure.

    The overview: every kind but Events; a job: that job, its Events, and the runners and pools its
    candidate table is made of; a change: that change and the jobs (its stages).
    """
    parts = [unquote(p) for p in path.split("/") if p]
    if len(parts) == 3 and parts[0] == "jobs":
        return f"agentjobs:{parts[2]},events:{parts[2]},runners,runnerpools"
    if len(parts) == 3 and parts[0] == "changes":
        return f"changes:{parts[2]},agentjobs"
    if parts == ["memory"]:
        return "memoryrecords"
    if parts == ["profiles"]:
        return "profiles"
    if parts == ["audit"]:
        return "auditrecords"
    return "runnerpools,runners,agentjobs,changes"


def parse_watches(text: str) -> dict[str, str | None]:
    """``kind`` or ``kind:name`` items, comma-separated, as a map of kind to one name (None: every one). Pure."""
    wanted: dict[str, str | None] = {}
    for item in text.split(","):
        kind, _, name = item.strip().partition(":")
        if kind:
            wanted[kind] = name or None
    return wanted


class Handler(BaseHTTPRequestHandler):
    server: ConsoleServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # the request line holds the login token
        return

    # Checks ------------------------------------------------------------------------------------
    def _host_ok(self) -> bool:
        port = self.server.port
        return self.headers.get("Host", "") in (f"127.0.0.1:{port}", f"localhost:{port}")

    def _cookie_ok(self) -> bool:
        for part in self.headers.get("Cookie", "").split(";"):
            key, _, value = part.strip().partition("=")
            if key == COOKIE and hmac.compare_digest(value.encode(), self.server.token.encode()):
                return True
        return False

    def _origin_ok(self) -> bool:
        origin = self.headers.get("Origin")
        port = self.server.port
        return origin is None or origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}")

    # Answers -----------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        # same-origin, not no-referrer: under no-referrer a form's POST is sent with ``Origin: null``.
        self.send_header("Referrer-Policy", "same-origin")
        self.send_header("Cache-Control", "no-store")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _page(self, answer: Answer, *, path: str, fragment: bool, flash: str = "", status: int | None = None) -> None:
        watches = decide_watches(urlsplit(path).path)
        marker = f'<div data-path="{html.e(path)}" data-watches="{html.e(watches)}"></div>'
        main = marker + answer.main
        body = main if fragment else html.layout(answer.title, main, flash=flash)
        self._send(status or answer.status, body.encode(), "text/html; charset=utf-8")

    def _json(self, answer: Answer) -> None:
        model = answer.model
        data: Any = {"error": answer.main} if model is None else model
        if dataclasses.is_dataclass(model) and not isinstance(model, type):
            data = dataclasses.asdict(model)
        self._send(answer.status, json.dumps(data, indent=1).encode(), "application/json")

    def _refuse(self, status: int, text: str) -> None:
        box = html.error_box(text)
        body = box if "fragment=1" in urlsplit(self.path).query else html.layout("Refused", box)
        self._send(status, body.encode(), "text/html; charset=utf-8")

    # Routes ------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        if not self._host_ok():
            return self._send(HTTPStatus.MISDIRECTED_REQUEST, b"wrong Host", "text/plain")
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        parts = [unquote(p) for p in url.path.split("/") if p]
        if parts == ["login"]:
            return self._login(query.get("token", [""])[0])
        if len(parts) == 2 and parts[0] == "static" and parts[1] in STATIC:
            data = resources.files("helmhive.console").joinpath("static", parts[1]).read_bytes()
            return self._send(200, data, f"{STATIC[parts[1]]}; charset=utf-8")
        if not self._cookie_ok():
            return self._refuse(401, "Open the URL that `helmhive console` printed (it holds this console's token).")
        if parts == ["events"]:
            return self._events(parse_watches(query.get("watches", [decide_watches("/")])[0]))
        as_json = bool(parts) and parts[0] == "api"
        if as_json:
            parts = parts[1:]
        fragment = query.get("fragment") == ["1"]
        pages = self.server.pages
        if parts == []:
            answer = pages.overview()
        elif parts == ["memory"]:
            answer = pages.memory()
        elif parts == ["profiles"]:
            answer = pages.profiles()
        elif parts == ["audit"]:
            answer = pages.audit(query)
        elif len(parts) == 3 and parts[0] == "jobs":
            answer = pages.job(parts[1], parts[2])
        elif len(parts) == 3 and parts[0] == "changes":
            answer = pages.change(parts[1], parts[2])
        elif len(parts) == 4 and parts[0] == "changes" and parts[3] == "patch" and not as_json:
            status, data = pages.patch_bytes(parts[1], parts[2])
            return self._send(status, data, "text/plain; charset=utf-8")
        else:
            return self._refuse(404, "No such page.")
        if as_json:
            return self._json(answer)
        kept = {k: v for k, v in query.items() if k != "fragment"}  # the audit search, kept on refresh
        shown = url.path + (f"?{urlencode(kept, doseq=True)}" if kept else "")
        return self._page(answer, path=shown, fragment=fragment)

    def do_POST(self) -> None:
        if not (self._host_ok() and self._origin_ok() and self._cookie_ok()):
            return self._refuse(403, "Refused: a request from outside this console.")
        self.close_connection = True  # what is left of a long body is never read as a next request
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
        length = min(int(self.headers.get("Content-Length") or 0), 4096)
        form = parse_qs(self.rfile.read(length).decode("utf-8", errors="replace"))
        if len(parts) != 4 or parts[0] != "changes" or parts[3] != "approve":
            return self._refuse(404, "No such action.")
        namespace, name = parts[1], parts[2]
        status, flash = self.server.pages.approve(namespace, name, form.get("digest", [""])[0])
        answer = self.server.pages.change(namespace, name)
        self._page(answer, path=f"/changes/{parts[1]}/{parts[2]}", fragment=False, flash=flash, status=status)

    def _login(self, token: str) -> None:
        if not hmac.compare_digest(token.encode(), self.server.token.encode()):
            return self._refuse(401, "This is not this console's token.")
        cookie = f"{COOKIE}={self.server.token}; HttpOnly; SameSite=Strict; Path=/"
        self._send(303, b"", "text/plain", {"Location": "/", "Set-Cookie": cookie})

    def _events(self, wanted: dict[str, str | None]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        hub = self.server.hub
        with hub.subscribe() as inbox:
            try:
                for kind, detail in list(hub.lost.items()):
                    self._event("lost", {"kind": kind, "detail": detail})
                self._event("hello", {})
                while True:
                    try:
                        notice = inbox.get(timeout=KEEPALIVE_SECONDS)
                    except queue.Empty:
                        self.wfile.write(b": keepalive\n\n")
                        self.wfile.flush()
                        continue
                    if notice.concerns(wanted):
                        self._event(notice.event, {"kind": notice.kind, "detail": notice.detail})
            except OSError:  # the page went away
                return

    def _event(self, event: str, data: dict[str, str]) -> None:
        self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()
