"""The gRPC door (KServe v2 over HTTP/2): ModelInferRequests serialized once and framed, sent
on a slot's own ModelStreamInfer stream (or as unary ModelInfer calls) over the engine's one
connection (wire.py, connection.py, call.py).

A sequence's id and START / END flags are KServe request parameters appended to a prepared
request as serialized map entries (protobuf merges repeated fields on concatenation), so
nothing is serialized again per request.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from tritonclient.grpc import service_pb2

from loadkit.scenario import RequestTemplate, TargetSpec
from loadkit.transport.call import InferError, StreamsFull, frame
from loadkit.transport.connection import Connection
from loadkit.transport.door import Outputs, Refs, Tensors, Ticket, connect_for, live
from loadkit.transport.wire import Wire

MODEL_INFER = b"/inference.GRPCInferenceService/ModelInfer"
MODEL_STREAM_INFER = b"/inference.GRPCInferenceService/ModelStreamInfer"
ERROR_FIELD_TAG = b"\x0a"  # ModelStreamInferResponse field 1 (error_message), serialized first
ERROR_BYTE = ERROR_FIELD_TAG[0]
# the serialized map entry of a true `triton_final_response` (InferParameter.bool_param = 1);
# a false one ends in \x08\x00
FINAL = b"\x0a\x15triton_final_response\x12\x02\x08\x01"


def _param(key: str, **value: object) -> bytes:
    req = service_pb2.ModelInferRequest()
    req.parameters[key].CopyFrom(service_pb2.InferParameter(**value))
    return req.SerializeToString()


START = _param("sequence_start", bool_param=True)
END = _param("sequence_end", bool_param=True)


def _in_region(params: Any, ref: tuple[str, int, int]) -> None:
    region, offset, size = ref
    params["shared_memory_region"].string_param = region
    params["shared_memory_offset"].int64_param = offset
    params["shared_memory_byte_size"].int64_param = size


class GrpcEncoder:
    """ModelInferRequest bytes, length-prefixed as one gRPC message."""

    name = "grpc"

    def __init__(self, target: TargetSpec | None = None, authority: str = ""):
        del target, authority  # the gRPC encoding does not depend on them

    def encode(self, template: RequestTemplate, tensors: Tensors, inputs: Refs | None = None,
               outputs: Refs | None = None) -> bytes:
        from loadkit.transport.payloads import tensor_bytes  # payloads imports this module

        req = service_pb2.ModelInferRequest(model_name=template.model,
                                            model_version=template.version)
        if template.decoupled:  # the final response then says so (engine/streaming.py)
            req.parameters["triton_enable_empty_final_response"].bool_param = True
        for key, value in template.parameters:
            param = req.parameters[key]
            if isinstance(value, bool):
                param.bool_param = value
            elif isinstance(value, int):
                param.int64_param = value
            elif isinstance(value, float):
                param.double_param = value
            else:
                param.string_param = value
        for spec, arr in tensors:
            tensor = req.inputs.add()
            tensor.name = spec.name
            tensor.datatype = spec.dtype
            tensor.shape.extend(arr.shape)
            if inputs:
                _in_region(tensor.parameters, inputs[spec.name])
            else:
                req.raw_input_contents.append(tensor_bytes(arr, spec.dtype))
        for name in outputs or template.outputs:
            out = req.outputs.add()
            out.name = name
            if outputs:
                _in_region(out.parameters, outputs[name])
        return frame(req.SerializeToString())

    def sequence_id(self, id_type: str, corr: int) -> bytes:
        """A correlation id as the parameter a model declares (`string` or `uint64`)."""
        if id_type == "string":
            return _param("sequence_id", string_param=str(corr))
        return _param("sequence_id", int64_param=corr)

    def in_sequence(self, wire: bytes, ids: bytes, first: bool, last: bool) -> bytes:
        """A framed request with a sequence's id and its START / END flags appended."""
        body = wire[5:] + ids + (START if first else b"") + (END if last else b"")
        return b"\x00" + len(body).to_bytes(4, "big") + body


class GrpcDoor:
    """Requests on the wire's live connection: each slot keeps its own stream (opened on first
    use, and again after a deadline, a reset or a lost connection), or one unary call each."""

    def __init__(self, *, address: str, target: TargetSpec, loop: asyncio.AbstractEventLoop,
                 unary: bool = False, tls: bool = False):
        del tls  # gRPC's TLS is target.tls
        self.encoder = GrpcEncoder(target)
        self.wire = Wire(address, target)
        self.loop = loop
        self.unary = unary

    @property
    def connects(self) -> int:
        return self.wire.connects

    def put(self, ticket: Ticket, payload: bytes) -> None:
        conn = self.wire.live()
        if conn is None:
            self.loop.create_task(self._connect_and_put(ticket, ticket.seq, payload))
        else:
            self._put(ticket, conn, payload)

    async def _connect_and_put(self, ticket: Ticket, seq: int, payload: bytes) -> None:
        conn = await connect_for(ticket, seq, self.wire.connection)
        if conn is not None and live(ticket, seq):  # not abandoned while connecting
            self._put(ticket, conn, payload)

    def _put(self, ticket: Ticket, conn: Connection, payload: bytes) -> None:
        unary = self.unary
        call = ticket.call
        decoupled = ticket.decoupled
        if call is not None and ticket.call_decoupled != decoupled and ticket.conn is conn:
            # a decoupled and a plain model's requests never share a stream (Triton 2.51
            # crashed so: docs/streaming.md); the idle one ends, this kind gets its own
            conn.send(call, b"", end_stream=True)
            call = ticket.call = None
        ticket.call_decoupled = decoupled
        if unary or call is None or call.ended or ticket.conn is not conn:
            if call is not None and ticket.conn is not None and not call.ended:
                ticket.conn.cancel(call, InferError("CANCELLED", "moved to a new connection"))
            try:
                call = conn.open(MODEL_INFER if unary else MODEL_STREAM_INFER, unary)
            except StreamsFull:  # as a grpc call does, wait for a stream the server frees
                ticket.call, ticket.stream_wait = None, conn.stream_limit
                conn.wait_stream(functools.partial(self._retry_put, ticket, ticket.seq))
                return
            except InferError as exc:
                ticket.call = None
                assert ticket.reply is not None
                ticket.reply(None, exc)
                return
            ticket.call, ticket.conn, ticket.stream_wait = call, conn, 0
        conn.send(call, payload, end_stream=unary)
        call.wait(ticket.reply)

    def _retry_put(self, ticket: Ticket, seq: int) -> None:
        """A stream was freed (or the connection is going away): send the waiting request on
        the live connection, unless its deadline abandoned it meanwhile."""
        conn = self.wire.live()
        if ticket.seq != seq or not ticket.sent_ns:
            if conn is not None:
                conn.release_waiting()  # the stream it was woken for goes to the next one
            return
        if conn is None:
            self.loop.create_task(self._connect_and_put(ticket, seq, ticket.payload))
        else:
            self._put(ticket, conn, ticket.payload)

    def retry(self, ticket: Ticket) -> None:
        ticket.call = None
        self.loop.call_soon(self._retry_put, ticket, ticket.seq)

    def more(self, ticket: Ticket) -> None:
        assert ticket.call is not None and ticket.reply is not None
        ticket.call.wait(ticket.reply)

    def cancel(self, ticket: Ticket, error: InferError) -> None:
        call, conn, ticket.call = ticket.call, ticket.conn, None
        if call is not None and conn is not None and not call.ended:
            conn.cancel(call, error)

    def own_us(self, ticket: Ticket, latency_us: int, end_ns: int) -> int:
        call, conn = ticket.call, ticket.conn
        if call is None or call.tx_ns < ticket.sent_ns:
            return 0
        rx_ns = conn.rx_ns if conn is not None and conn.rx_ns > call.tx_ns else end_ns
        return latency_us - (rx_ns - call.tx_ns) // 1000

    def error_in(self, message: bytes) -> str | None:
        if message[:1] != ERROR_FIELD_TAG or self.unary:
            return None
        return service_pb2.ModelStreamInferResponse.FromString(message).error_message or None

    @staticmethod
    def response_kind(message: bytes) -> tuple[bool, bool]:
        """(whether the message ends its request, whether it is a response with outputs). An
        error ends it too: the engine reads the error as it does for any request. Reading one
        costs a substring search; only the final one is parsed."""
        if message[0] != ERROR_BYTE and FINAL not in message:  # the common case
            return False, True
        if message[:1] == ERROR_FIELD_TAG:
            return True, False
        reply = service_pb2.ModelStreamInferResponse.FromString(message).infer_response
        return True, bool(reply.outputs or reply.raw_output_contents)  # else the end marker

    @staticmethod
    def text_output(message: bytes) -> bytes:
        """A streamed response's BYTES `text_output`, its elements joined (for a tokenizer)."""
        reply = service_pb2.ModelStreamInferResponse.FromString(message).infer_response
        text = bytearray()
        for i, out in enumerate(reply.outputs):
            if out.name == "text_output" and i < len(reply.raw_output_contents):
                raw = reply.raw_output_contents[i]
                pos = 0
                while pos + 4 <= len(raw):  # BYTES: 4-byte little-endian length per element
                    n = int.from_bytes(raw[pos:pos + 4], "little")
                    text += raw[pos + 4:pos + 4 + n]
                    pos += 4 + n
        return bytes(text)

    def outputs(self, ticket: Ticket, message: bytes) -> Outputs:
        if self.unary:
            resp = service_pb2.ModelInferResponse.FromString(message)
        else:
            resp = service_pb2.ModelStreamInferResponse.FromString(message).infer_response
        raw = resp.raw_output_contents
        return {o.name: (o.datatype, raw[k]) for k, o in enumerate(resp.outputs)
                if k < len(raw)}

    def cork(self) -> Any:
        conn = self.wire.live()
        if conn is not None:
            conn.corked = True
        return conn

    def uncork(self, token: Any) -> None:
        if token is not None:
            token.corked = False
            token.flush()

    def close(self) -> None:
        self.wire.close()
