"""The transport seam: what the engine asks of a door into Triton (gRPC, HTTP/REST), and what
the payload builder asks of its encoder.

A door owns its connections and its wire format. The engine hands it a prepared request on a
`Ticket` (the engine's Slot is one) and hears back through `ticket.reply(message, error)`,
called on the engine's loop, once per message of the request (a decoupled model's stream:
more than once, each after `more`). Everything protocol-specific stays behind these two
classes: a new door is one file under transport/ plus its control-plane client under
control/ (docs/architecture.md, docs/doors.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from loadkit.scenario import InputSpec, RequestTemplate
from loadkit.transport.call import InferError

Reply = Callable[[bytes | None, InferError | None], None]
# a response's outputs as validation reads them: name -> (datatype, raw row-major bytes)
Outputs = dict[str, tuple[str, bytes]]
Tensors = Sequence[tuple[InputSpec, np.ndarray]]
# where a request's tensors are in shared memory (transport/shm.py): name -> (region, offset,
# byte size); an input named here is not carried in the request, an output is written there
Refs = dict[str, tuple[str, int, int]]


@dataclass(eq=False, kw_only=True)
class Ticket:
    """Room for one request in flight as a door sees it; `call` and `conn` are the door's own
    (what it keeps between requests: a gRPC stream and its connection, an HTTP connection)."""

    call: Any = None
    conn: Any = None
    sent_ns: int = 0
    seq: int = 0  # which request it carries, so a late connect never sends a stale one
    reply: Reply | None = None  # bound once by the engine
    stream_wait: int = 0  # waiting for a free stream: the server's limit, else 0
    payload: bytes = b""  # the request in flight (sent again where the door must)
    decoupled: bool = False  # this request is a decoupled model's (read to its final response)
    call_decoupled: bool = False  # the door's `call` carries a decoupled model's requests


class Encoder(Protocol):
    """How a door writes requests: each pool entry once, at start; a sequence's id and flags
    added to a prepared request without encoding it again."""

    name: str

    def encode(self, template: RequestTemplate, tensors: Tensors, inputs: Refs | None = None,
               outputs: Refs | None = None) -> bytes:
        """The request as it goes on the wire (framing included); `inputs`/`outputs`: the
        tensors in shared memory instead."""
        ...

    def sequence_id(self, id_type: str, corr: int) -> bytes: ...

    def in_sequence(self, wire: bytes, ids: bytes, first: bool, last: bool) -> bytes: ...


class Door(Protocol):
    """A way into Triton, driven from the engine's thread."""

    encoder: Encoder
    connects: int  # connections made (reconnects show as more than one per connection)

    def put(self, ticket: Ticket, payload: bytes) -> None:
        """Start the request; `ticket.reply` hears how it ends (a decoupled one's later
        messages come after `more`)."""
        ...

    def more(self, ticket: Ticket) -> None:
        """Wait for the next message of the ticket's streamed request."""
        ...

    def cancel(self, ticket: Ticket, error: InferError) -> None:
        """End the ticket's request on the wire (a deadline, a user's cancel); its reply, if
        still due, carries `error`."""
        ...

    def retry(self, ticket: Ticket) -> None:
        """Send the ticket's request again (the server refused it before handling it)."""
        ...

    def own_us(self, ticket: Ticket, latency_us: int, end_ns: int) -> int:
        """Of `latency_us`, the part spent in loadkit's own framing (0 when unknown)."""
        ...

    def error_in(self, message: bytes) -> str | None:
        """The server's error carried inside a message (a gRPC stream's error_message)."""
        ...

    def outputs(self, ticket: Ticket, message: bytes) -> Outputs:
        """A response's outputs, for validation."""
        ...

    def response_kind(self, message: bytes) -> tuple[bool, bool]:
        """Of one streamed message: (it ends its request, it is a response with outputs)."""
        ...

    def text_output(self, message: bytes) -> bytes:
        """A streamed response's text (`text_output`), for a tokenizer to count."""
        ...

    def cork(self) -> Any:
        """Hold writes until `uncork` (an open loop's due arrivals leave in one write)."""
        ...

    def uncork(self, token: Any) -> None: ...

    def close(self) -> None: ...


def live(ticket: Ticket, seq: int) -> bool:
    """The ticket still carries request `seq` (not ended by a deadline meanwhile)."""
    return ticket.seq == seq and bool(ticket.sent_ns)


async def connect_for(ticket: Ticket, seq: int, connect: Callable[[], Awaitable[Any]]) -> Any:
    """The connection `connect()` gives; None when it failed (the ticket's request, if still
    live, ends with why), as every door's first send on a new connection needs."""
    assert ticket.reply is not None
    try:
        return await connect()
    except InferError as exc:
        if live(ticket, seq):
            ticket.reply(None, exc)
        return None
    except asyncio.CancelledError:
        if live(ticket, seq):
            ticket.reply(None, InferError("CANCELLED", "loadkit stopped"))
        raise
