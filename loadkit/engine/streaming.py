"""Decoupled models: one request, several responses, then a final one. The request is
complete at the response the door says is its last (over gRPC: `triton_final_response`,
asked for with `triton_enable_empty_final_response`, transport/grpc_door.py); each response
with outputs before it is one streamed response (a token, for an LLM).

A slot carries one request at a time on its stream, so every response on the stream is that
request's: matching needs no id. How each template's requests are read is here; how a
response is read is the door's (`response_kind`, `text_output`).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from typing import Any

from loadkit.transport.call import InferError

# a request the scenario asked to cancel after N responses (`cancel:`): its stream is reset
# (Triton cancels the request) and it is counted apart from successes and errors
CANCELLED_HERE = InferError("CANCELLED", "cancelled by loadkit after its first responses "
                                         "(the template's cancel:)")


class Read(enum.IntEnum):
    """How one request's responses are read. An int for the hot path (send takes it as is);
    a positive value N, outside the enum, means: cancel the request after N responses."""

    PLAIN = 0  # a plain model: one response
    TO_END = -1  # a decoupled model: read to its final response
    KEEP = -2  # the same, keeping the responses for the template's tokenizer to count


class StreamPolicy:
    """Per template, how a decoupled model's requests are read: `streaming[i]` is Read.TO_END
    for one (Read.PLAIN: a plain model's), `cancel[i]` (after N responses, share) or None,
    `tokenizers[i]` the llm template's tokenizer (exact output tokens) or None; `goodput`
    limits in µs."""

    def __init__(self, names: list[str], *, streaming: list[int] | None = None,
                 cancel: list[tuple[int, float] | None] | None = None,
                 tokenizers: list[Any] | None = None,
                 goodput: tuple[int, int, int] | None = None):
        self.names = names
        self.streaming: list[int] = streaming or [Read.PLAIN] * len(names)
        self.cancel: list[tuple[int, float] | None] = cancel or [None] * len(names)
        self.tokenizers: list[Any] = tokenizers or [None] * len(names)
        self.goodput = goodput  # first response, mean gap, latency (µs); None: no goodput

    def mode(self, i: int, rng: random.Random) -> int:
        """One request's Read: N > 0: cancel it after N responses (its template's `cancel:`
        drew it); else read to its end, keeping the responses if a tokenizer counts them."""
        if (c := self.cancel[i]) is not None and rng.random() < c[1]:
            return c[0]
        return Read.KEEP if self.tokenizers[i] is not None else Read.TO_END

    def tokens(self, name: str, result: Any, text_of: Callable[[bytes], bytes]) -> int | None:
        tok = self.tokenizers[self.names.index(name)] if result.kept is not None else None
        return None if tok is None else output_tokens(tok, result.kept, text_of)


def output_tokens(tok: Any, kept: list[bytes], text_of: Callable[[bytes], bytes]) -> int:
    """Exact output tokens: the tokenizer over the text a request's responses streamed (their
    BYTES `text_output`, joined; `text_of` reads it from a response, the door's)."""
    text = b"".join(text_of(message) for message in kept)
    return len(tok.encode(text.decode("utf-8", "replace")).ids)
