"""One gRPC call on an HTTP/2 stream, as grpc's own client reads it: the length-prefixed messages
of its DATA frames (kept in pieces until whole; a compressed or oversized message refused), its
grpc-status, and the status names a reset stream or a non-gRPC HTTP answer map to.

The connection (wire.py) hands each call its DATA frames; the engine hears how the call ended
through a plain callback (Reply).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

import grpc
import h2.errors

STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
MAX_MESSAGE_BYTES = 4 << 20  # grpc's default receive limit (target.max_message_size)


class StreamsFull(Exception):
    """The server's MAX_CONCURRENT_STREAMS is reached on this connection: wait for a stream."""


class InferError(Exception):
    """A failed inference, with the status name the report counts it under."""

    def __init__(self, code: str, details: str, refused: bool = False):
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details
        # the server never handled the call (REFUSED_STREAM): safe to send again, as grpc's
        # transparent retry does
        self.refused = refused


def frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed), built once per template."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


Reply = Callable[[bytes | None, InferError | None], None]


class Call:
    """One HTTP/2 stream: a ModelStreamInfer stream (many messages) or one ModelInfer call.

    The waiter is a plain callback, called on the loop with (message, None) or (None, error):
    an open loop starts thousands of requests a second, and a future and a task per request
    were a third of its client CPU. A stream's messages are handed out as they arrive; a unary
    call's one message only once the trailers said OK.
    """

    __slots__ = ("stream_id", "unary", "parts", "have", "need", "max_size", "messages", "waiter",
                 "pending", "end_after", "error", "ended", "tx_ns", "unacked", "status_seen")

    def __init__(self, stream_id: int, unary: bool, max_size: int = MAX_MESSAGE_BYTES):
        self.stream_id = stream_id
        self.unary = unary
        # a message split over frames: its pieces, their length, the length that completes it
        # (joined once, so a 4 MB reply in 16 KB frames is copied once, not 256 times)
        self.parts: list[bytes] = []
        self.have = 0
        self.need = 0
        self.max_size = max_size
        self.messages: collections.deque[bytes] = collections.deque()
        self.waiter: Reply | None = None
        self.pending = b""  # bytes the server's flow-control window has no room for yet
        self.end_after = False  # end the stream once `pending` is sent
        self.error: InferError | None = None
        self.ended = False
        self.tx_ns = 0  # when the last message sent on it left in a socket write
        self.unacked = 0  # response bytes taken on the fast path, not yet handed back (window)
        self.status_seen = False  # grpc-status arrived (trailers, or a trailers-only reply)

    def feed(self, data: bytes) -> InferError | None:
        """Take a DATA frame's bytes; an error (a compressed or oversized message, as grpc
        refuses them) means the caller must reset the stream and end the call with it."""
        if self.parts:
            self.parts.append(data)
            self.have += len(data)
            if self.have < self.need:
                return None
            data = b"".join(self.parts)
            self.parts, self.have = [], 0
        pos, end = 0, len(data)
        while end - pos >= 5:
            if data[pos]:
                return InferError("INTERNAL", "the server sent a compressed message, which "
                                  "loadkit did not ask for (no grpc-accept-encoding)")
            n = int.from_bytes(data[pos + 1 : pos + 5], "big")
            if n > self.max_size:
                return InferError("RESOURCE_EXHAUSTED", f"received message larger than max "
                                  f"({n} vs. {self.max_size}; target.max_message_size)")
            if end - pos - 5 < n:
                break
            message = data[pos + 5 : pos + 5 + n]
            pos += 5 + n
            waiter = self.waiter
            if waiter is not None and not self.unary:
                self.waiter = None
                waiter(message, None)
            else:
                self.messages.append(message)
        if pos < end:
            rest = data[pos:] if pos else data
            self.parts, self.have = [rest], len(rest)
            self.need = 5 + int.from_bytes(rest[1:5], "big") if len(rest) >= 5 else 5
        return None

    def end(self, error: InferError | None = None) -> None:
        """The stream is over (trailers, reset, lost connection): settle the waiter."""
        if error is not None and self.error is None:
            self.error = error
        self.ended = True
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            self._settle(waiter)

    def wait(self, waiter: Reply) -> None:
        """Call `waiter` once with the next message or the error that ended the stream."""
        if self.ended or (self.messages and not self.unary):
            self._settle(waiter)
        else:
            self.waiter = waiter

    def next_message(self) -> asyncio.Future[bytes]:
        """`wait` as a future, for code that awaits one message at a time."""
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        def reply(message: bytes | None, error: InferError | None) -> None:
            if fut.done():
                return
            if message is None:
                fut.set_exception(error or InferError("UNAVAILABLE", "stream ended early"))
            else:
                fut.set_result(message)

        self.wait(reply)
        return fut

    def _settle(self, waiter: Reply) -> None:
        if self.unary and self.ended and not self.status_seen and self.error is None:
            self.error = InferError("INTERNAL", "the stream ended without a grpc-status")
        if self.messages and not (self.unary and self.error):
            waiter(self.messages.popleft(), None)
        else:
            waiter(None, self.error or InferError("UNAVAILABLE", "stream ended early"))


# As grpc maps them (status_conversion.cc): a reset stream's HTTP/2 code -> gRPC status; an HTTP
# status without grpc-status -> gRPC status (doc/http-grpc-status-mapping.md).
RESET_STATUS = {
    h2.errors.ErrorCodes.REFUSED_STREAM: "UNAVAILABLE",
    h2.errors.ErrorCodes.CANCEL: "CANCELLED",
    h2.errors.ErrorCodes.ENHANCE_YOUR_CALM: "RESOURCE_EXHAUSTED",
    h2.errors.ErrorCodes.INADEQUATE_SECURITY: "PERMISSION_DENIED",
}
HTTP_STATUS = {
    b"400": "INTERNAL", b"401": "UNAUTHENTICATED", b"403": "PERMISSION_DENIED",
    b"404": "UNIMPLEMENTED", b"429": "UNAVAILABLE", b"502": "UNAVAILABLE",
    b"503": "UNAVAILABLE", b"504": "UNAVAILABLE",
}


def _reset_status(code: Any) -> str:
    return RESET_STATUS.get(code, "INTERNAL")
