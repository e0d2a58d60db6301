"""One HTTP/1.1 keep-alive connection of the HTTP door (http_door.py), carrying one request
at a time: its response read by hand as it arrives (status line, Content-Length or chunked, the
inference header's length; a text/event-stream response event by event, sse.py)."""

from __future__ import annotations

import asyncio
import collections
import json
import time
from typing import Any

from loadkit.transport.call import InferError
from loadkit.transport.sse import SseReader

# Triton's HTTP status for an error -> the gRPC status name reports count it under (the mapping
# Triton's two frontends share: TRITONSERVER_Error codes)
STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
          404: "NOT_FOUND", 409: "ALREADY_EXISTS", 429: "UNAVAILABLE", 499: "CANCELLED",
          500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
          504: "DEADLINE_EXCEEDED"}
HEADER_LENGTH = b"inference-header-content-length"
ERROR_BODY = b'{"error"'  # a generate response (or event) that is the server's error
END = b""  # what the door hands the engine when a stream of events ended


class HttpConn(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.waiter: Any = None  # the ticket's reply for the request in flight
        self.buf = b""
        self.need = -1  # body bytes still due (-1: the head is not in yet)
        self.chunked = False
        self.status = 0
        self.header_len = 0  # the response's inference header length (0: all JSON)
        self.keep = True
        self.tx_ns = 0
        self.rx_ns = 0
        # a text/event-stream response (generate_stream): its reader, and events the engine
        # has not asked for yet
        self.sse: SseReader | None = None
        self.events: collections.deque[bytes] = collections.deque()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, payload: bytes, reply: Any) -> None:
        assert self.transport is not None
        self.waiter = reply
        self.buf, self.need, self.sse = b"", -1, None
        self.events.clear()
        self.tx_ns = time.perf_counter_ns()
        self.transport.write(payload)

    def wait(self, reply: Any) -> None:
        """`reply` hears the stream's next event (END once it ended)."""
        if self.events:
            reply(self.events.popleft(), None)
        else:
            self.waiter = reply

    def data_received(self, data: bytes) -> None:
        self.rx_ns = time.perf_counter_ns()
        if self.sse is not None:
            self._stream(data)
            return
        buf = self.buf + data if self.buf else data
        if self.need < 0:
            if buf[:2] == b"\r\n":  # what a previous body left (a chunked body's last CRLF)
                buf = buf.lstrip(b"\r\n")
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            self._head(buf[:end])
            buf = buf[end + 4:]
            if self.sse is not None:
                self.buf = b""
                self._stream(buf)
                return
        if self.chunked:
            body = _dechunk(buf)
            if body is None:
                self.buf = buf
                return
        elif len(buf) < self.need:
            self.buf = buf
            return
        else:
            body = buf[:self.need]
        self.buf, self.need = b"", -1
        waiter, self.waiter = self.waiter, None
        if not self.keep:
            self.close()
        if waiter is None:
            return
        if self.status == 200:
            waiter(body, None)
        else:
            waiter(None, _error(self.status, body))

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        length, self.chunked, self.header_len, self.keep = 0, False, 0, True
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            key = key.strip().lower()
            if key == b"content-length":
                length = int(value)
            elif key == HEADER_LENGTH:
                self.header_len = int(value)
            elif key == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
            elif key == b"connection" and value.strip().lower() == b"close":
                self.keep = False
            elif key == b"content-type" and value.strip().startswith(b"text/event-stream"):
                self.sse = SseReader() if self.status == 200 else None
        self.need = length

    def _stream(self, data: bytes) -> None:
        """Hand each whole event to the waiting reply (or keep it), then END."""
        assert self.sse is not None
        for event in self.sse.feed(data):
            self._deliver(event)
        if self.sse.ended:
            self.sse, self.need = None, -1
            if not self.keep:
                self.close()
            self._deliver(END)

    def _deliver(self, message: bytes) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter(message, None)
        else:
            self.events.append(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter(None, InferError("UNAVAILABLE",
                                    f"the server closed the connection ({exc or 'EOF'})"))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _dechunk(buf: bytes) -> bytes | None:
    """A chunked body, or None while it is not all in."""
    out, pos = [], 0
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(buf[pos:eol].split(b";")[0], 16)
        if size == 0:
            return b"".join(out) if buf.find(b"\r\n", eol + 2) >= 0 else None
        if len(buf) < eol + 2 + size + 2:
            return None
        out.append(buf[eol + 2: eol + 2 + size])
        pos = eol + 2 + size + 2


def _error(status: int, body: bytes) -> InferError:
    try:
        text = str(json.loads(body).get("error", "")) or body.decode(errors="replace")
    except (ValueError, AttributeError):
        text = body.decode(errors="replace")
    return InferError(STATUS.get(status, "UNKNOWN"), f"HTTP {status}: {text}".strip())
