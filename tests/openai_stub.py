"""A small OpenAI-compatible streaming server on loopback, for token-bill tests.

It streams ``/v1/chat/completions`` as server-sent events, one token per
event with a delay, and records how many tokens it generated before the client
closed the connection, so a test can prove the client really hung up.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StreamLog:
    """One streamed response: how many tokens went out, and how it ended."""

    def __init__(self) -> None:
        self.sent = 0
        self.disconnected = threading.Event()
        self.finished = threading.Event()


class StubState:
    """What the server saw (totals over all requests, and each stream's own log)."""

    def __init__(self, tokens: int, delay: float) -> None:
        self.tokens = tokens
        self.delay = delay
        self.sent = 0
        self.requests = 0
        self.disconnected = threading.Event()
        self.finished = threading.Event()
        self.streams: list[StreamLog] = []


def _peer_closed(sock: socket.socket) -> bool:
    """Whether the client hung up (checked before each token, so a token is counted as
    sent only while the client was still there to read it)."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def _handler(state: StubState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            state.requests += 1
            log = StreamLog()
            state.streams.append(log)
            if not body.get("stream"):
                self.send_response(400)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            created = int(time.time())
            try:
                for token_index in range(state.tokens):
                    if _peer_closed(self.connection):
                        raise BrokenPipeError("the client closed the stream")
                    event = {
                        "id": "chatcmpl-stub",
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": body.get("model", "stub"),
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"role": "assistant", "content": f"tok{token_index} "},
                                "finish_reason": None,
                            }
                        ],
                    }
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()
                    state.sent += 1
                    log.sent += 1
                    time.sleep(state.delay)
                done = {
                    "id": "chatcmpl-stub",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": body.get("model", "stub"),
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                }
                self.wfile.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                state.finished.set()
                log.finished.set()
            except (BrokenPipeError, ConnectionResetError):
                state.disconnected.set()
                log.disconnected.set()

    return Handler


class OpenAIStub:
    """Start with ``with OpenAIStub(tokens=200, delay=0.01) as stub: stub.base_url``."""

    def __init__(self, *, tokens: int = 200, delay: float = 0.01) -> None:
        self.state = StubState(tokens, delay)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """The ``/v1`` base URL to give the OpenAI client."""
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> OpenAIStub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
