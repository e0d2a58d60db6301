"""wire.py's gRPC framing against the real embedded Triton: messages larger than the server's
flow-control window, the server's error statuses, and a connection that survives both."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pytest
from conftest import wait_for
from tritonclient.grpc import service_pb2

from loadkit.scenario import TargetSpec
from loadkit.transport.call import InferError, frame
from loadkit.transport.wire import Wire

INFER = b"/inference.GRPCInferenceService/ModelInfer"
STREAM = b"/inference.GRPCInferenceService/ModelStreamInfer"


def dense_request(n_floats: int = 256) -> bytes:
    req = service_pb2.ModelInferRequest(model_name="dense")
    tensor = req.inputs.add()
    tensor.name, tensor.datatype = "INPUT0", "FP32"
    tensor.shape.extend([1, 256])
    req.raw_input_contents.append(np.ones(n_floats, np.float32).tobytes())
    return frame(req.SerializeToString())


async def unary(wire: Wire, payload: bytes) -> bytes:
    conn = await wire.connection()
    call = conn.open(INFER, unary=True)
    conn.send(call, payload, end_stream=True)
    return await asyncio.wait_for(call.next_message(), 20)


def test_big_message_is_sent_in_pieces_and_the_connection_survives_errors(triton) -> None:
    """6 MB is more than the server's 4 MB window: the send must wait for WINDOW_UPDATEs. The
    server answers only once it has the whole message (here: the wrong byte size)."""

    async def main() -> None:
        wire = Wire(triton.grpc_address, TargetSpec(grpc=triton.grpc_address))
        conn = await wire.connection()
        assert conn.h2.remote_settings.initial_window_size < 6 << 20
        with pytest.raises(InferError) as err:
            await unary(wire, dense_request((6 << 20) // 4))
        assert err.value.code == "INVALID_ARGUMENT", err.value
        assert f"got {6 << 20}" in str(err.value), err.value  # every byte arrived
        ok = await unary(wire, dense_request())
        assert len(ok) > 1024  # OUTPUT0: 256 floats
        missing = service_pb2.ModelInferRequest(model_name="no_such_model").SerializeToString()
        with pytest.raises(InferError) as err:
            await unary(wire, frame(missing))
        assert err.value.code in {"NOT_FOUND", "UNAVAILABLE", "INVALID_ARGUMENT"}, err.value
        assert await wire.connection() is conn, "status errors must not cost the connection"
        # the stream method on the same connection: many messages on one stream
        call = conn.open(STREAM)
        for _ in range(3):
            conn.send(call, dense_request())
            assert len(await asyncio.wait_for(call.next_message(), 20)) > 1024
        wire.close()

    asyncio.run(main())


def test_unreachable_server_fails_fast_then_backs_off(triton) -> None:
    """A refused connection is UNAVAILABLE at once; the next attempt waits out the backoff, so
    a closed loop fails once per backoff instead of spinning."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        address = f"127.0.0.1:{port}"
        wire = Wire(address, TargetSpec(grpc=address))
        t0 = loop.time()
        with pytest.raises(InferError) as err:
            await wire.connection()
        assert err.value.code == "UNAVAILABLE"
        first = loop.time() - t0
        t1 = loop.time()
        with pytest.raises(InferError):
            await wire.connection()
        return first, loop.time() - t1

    first, second = asyncio.run(main())
    assert first < 0.5, first
    assert 0.15 <= second <= 1.0, second


def test_new_calls_move_to_a_fresh_connection_before_stream_ids_run_out(
    triton, control, monkeypatch
) -> None:
    """HTTP/2 allows 2^30 client streams per connection. Past the limit (here made 5) new calls
    go on a new connection; a stream still open on the old one keeps working, and the old one
    closes once it has ended. No request is lost on the way."""
    import loadkit.transport.wire as wire_module

    monkeypatch.setattr(wire_module, "STREAMS_PER_CONNECTION", 5)

    async def main() -> int:
        wire = Wire(triton.grpc_address, TargetSpec(grpc=triton.grpc_address))
        first = await wire.connection()
        stream = first.open(STREAM)
        served = 0
        for _ in range(12):
            assert len(await unary(wire, dense_request())) > 1024
            served += 1
        assert wire.connects >= 3, wire.connects
        assert first in wire.retired and not first.closed, "its stream is still open"
        conn_now = await wire.connection()
        assert conn_now is not first and conn_now.opened <= 5
        first.send(stream, dense_request())
        assert len(await asyncio.wait_for(stream.next_message(), 20)) > 1024
        served += 1
        first.cancel(stream, InferError("CANCELLED", "test done"))
        assert first.closed, "a retired connection closes when its last call ends"
        wire.close()
        assert all(c.closed for c in (first, conn_now))
        return served

    assert served_as_counted(control, main) == 13


def test_fast_path_hands_the_receive_window_back(triton, control, monkeypatch) -> None:
    """Response DATA frames bypass h2 (Connection.data_received), so loadkit returns their
    flow-control window itself. With the window made 16 KiB, 300 responses of ~1 KiB on one
    stream (and unary calls on the same connection) are over 18 windows: without the
    WINDOW_UPDATEs the server would stop sending after the first and every wait time out."""
    import loadkit.transport.connection as wire_module

    monkeypatch.setattr(wire_module, "WINDOW", 16 << 10)

    async def main() -> int:
        wire = Wire(triton.grpc_address, TargetSpec(grpc=triton.grpc_address))
        conn = await wire.connection()
        stream = conn.open(STREAM)
        received = served = 0
        for i in range(300):
            conn.send(stream, dense_request())
            received += len(await asyncio.wait_for(stream.next_message(), 5))
            served += 1
            if i % 100 == 0:
                received += len(await unary(wire, dense_request()))
                served += 1
        assert received > 18 * (16 << 10)
        assert await wire.connection() is conn
        wire.close()
        return served

    assert served_as_counted(control, main) == 303


def served_as_counted(control: Any, main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run `main()` (which returns how many requests it had answered) and check the server's
    success counter moved by exactly that much. Triton updates it just after it sends the
    response (a CI run read it one short, right after the last reply), so the count is
    awaited, with a deadline, then compared exactly."""
    before = control.counters(("dense",))["dense"].success
    served = asyncio.run(main())

    def delta() -> int:
        return control.counters(("dense",))["dense"].success - before

    wait_for(lambda: delta() >= served, 5, f"the server to count {served} successes")
    assert delta() == served
    return served


def test_frames_split_across_reads_arrive_whole(triton, control, monkeypatch) -> None:
    """The fast path cuts whole frames out of each read and keeps the rest for the next one.
    Here every read the server's bytes produce is fed to it 7 bytes at a time (frame headers
    and messages split anywhere, h2's frames too): stream and unary replies and a status error
    must all arrive intact, and the server's count must match."""
    import loadkit.transport.connection as wire_module

    whole = wire_module.Connection.data_received

    def in_pieces(self: wire_module.Connection, data: bytes) -> None:
        for i in range(0, len(data), 7):
            whole(self, data[i : i + 7])

    expected = len(asyncio.run(_one_stream_reply(triton)))
    monkeypatch.setattr(wire_module.Connection, "data_received", in_pieces)

    async def main() -> int:
        wire = Wire(triton.grpc_address, TargetSpec(grpc=triton.grpc_address))
        conn = await wire.connection()
        stream = conn.open(STREAM)
        for _ in range(20):
            conn.send(stream, dense_request())
            assert len(await asyncio.wait_for(stream.next_message(), 5)) == expected
        assert len(await unary(wire, dense_request())) > 1024
        with pytest.raises(InferError) as err:
            await unary(wire, dense_request(255))  # wrong byte size: a status, not a reply
        assert err.value.code == "INVALID_ARGUMENT", err.value
        assert await wire.connection() is conn
        wire.close()
        return 21

    assert served_as_counted(control, main) == 21


async def _one_stream_reply(triton: Any) -> bytes:
    """One stream reply read without any splitting, to compare sizes against."""
    wire = Wire(triton.grpc_address, TargetSpec(grpc=triton.grpc_address))
    conn = await wire.connection()
    stream = conn.open(STREAM)
    conn.send(stream, dense_request())
    reply = await asyncio.wait_for(stream.next_message(), 5)
    wire.close()
    return reply
