"""Decoupled models: one request, several responses on its ModelStreamInfer stream, then a
final one. The request is complete at the response whose `triton_final_response` parameter is
true (asked for with `triton_enable_empty_final_response`, transport/payloads.py); each
response with outputs before it is one streamed response (a token, for an LLM).

A slot carries one request at a time on its stream, so every response on the stream is that
request's: matching needs no id. Reading a response costs one substring search; only the final
one is parsed (whether it carries outputs or is the empty end marker).
"""

from __future__ import annotations

import enum
import random
from typing import Any

from tritonclient.grpc import service_pb2

from loadkit.transport.call import InferError

# the serialized map entry of a true `triton_final_response` (InferParameter.bool_param = 1);
# a false one ends in \x08\x00
FINAL = b"\x0a\x15triton_final_response\x12\x02\x08\x01"
ERROR_FIELD_TAG = b"\x0a"  # ModelStreamInferResponse field 1 (error_message), serialized first
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


def response_kind(message: bytes) -> tuple[bool, bool]:
    """(whether the message ends its request, whether it is a response with outputs). An
    error ends it too: the engine reads the error as it does for any request."""
    if message[:1] == ERROR_FIELD_TAG:
        return True, False
    if FINAL not in message:
        return False, True
    reply = service_pb2.ModelStreamInferResponse.FromString(message).infer_response
    return True, bool(reply.outputs or reply.raw_output_contents)  # else the empty marker


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

    def tokens(self, name: str, result: Any) -> int | None:
        tok = self.tokenizers[self.names.index(name)] if result.kept is not None else None
        return None if tok is None else output_tokens(tok, result.kept)


def output_tokens(tok: Any, kept: list[bytes]) -> int:
    """Exact output tokens: the tokenizer over the text a request's responses streamed (their
    BYTES `text_output`, joined)."""
    text = bytearray()
    for message in kept:
        reply = service_pb2.ModelStreamInferResponse.FromString(message).infer_response
        for i, out in enumerate(reply.outputs):
            if out.name == "text_output" and i < len(reply.raw_output_contents):
                raw = reply.raw_output_contents[i]
                pos = 0
                while pos + 4 <= len(raw):  # BYTES: 4-byte little-endian length per element
                    n = int.from_bytes(raw[pos:pos + 4], "little")
                    text += raw[pos + 4:pos + 4 + n]
                    pos += 4 + n
    return len(tok.encode(text.decode("utf-8", "replace")).ids)
