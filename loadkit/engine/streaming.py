"""Decoupled models: one request, several responses on its ModelStreamInfer stream, then a
final one. The request is complete at the response whose `triton_final_response` parameter is
true (asked for with `triton_enable_empty_final_response`, transport/payloads.py); each
response with outputs before it is one streamed response (a token, for an LLM).

A slot carries one request at a time on its stream, so every response on the stream is that
request's: matching needs no id. Reading a response costs one substring search; only the final
one is parsed (whether it carries outputs or is the empty end marker).
"""

from __future__ import annotations

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


def response_kind(message: bytes) -> tuple[bool, bool]:
    """(whether the message ends its request, whether it is a response with outputs). An
    error ends it too: the engine reads the error as it does for any request."""
    if message[:1] == ERROR_FIELD_TAG:
        return True, False
    if FINAL not in message:
        return False, True
    reply = service_pb2.ModelStreamInferResponse.FromString(message).infer_response
    return True, bool(reply.outputs or reply.raw_output_contents)  # else the empty marker
