"""wire.py behaves as a grpc client does where a proxy or a busy server is in the way.

Against the real embedded Triton where it can produce the condition (a reply above the message
limit, a large reply in many frames), otherwise against a real grpcio server (tests/grpc_peer.py:
grpc's own HTTP/2 stack) configured to produce it: a stream limit, GOAWAY, compression. Each
test runs the real Engine (or Wire) and checks that every request is accounted for."""

from __future__ import annotations

import asyncio
import functools
import random
import ssl
import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import trustme
from conftest import wait_for
from grpc_peer import Peer, request_bytes
from tritonclient.grpc import service_pb2

from loadkit.engine.core import Engine
from loadkit.engine.host import Host
from loadkit.loads.closed import run_closed
from loadkit.plan import Step
from loadkit.record import Recorder, StepWindow
from loadkit.scenario import TargetSpec, TLSSpec
from loadkit.transport.call import MAX_MESSAGE_BYTES, Call, InferError, frame
from loadkit.transport.wire import Wire

INFER = b"/inference.GRPCInferenceService/ModelInfer"
STREAM = b"/inference.GRPCInferenceService/ModelStreamInfer"


def drive(address: str, target: TargetSpec, payload: bytes, users: int, count: int,
          transport: str = "stream", timeout_s: float = 30.0) -> tuple[StepWindow, Engine]:
    """`users` closed loops on a real Engine until `count` requests have ended (bounded by
    `timeout_s`), then a drained close: the window holds every request sent."""
    recorder = Recorder()
    engine = Engine(address=address, target=target, pools=[[frame(payload)]], names=["t"],
                    pick=lambda _rng: 0, recorder=recorder, method=transport)
    engine.start()
    window = recorder.open(Step(phase_index=0, phase="p", index=0, concurrency=users,
                                warmup_s=0.0, duration_s=1.0))
    for i in range(users):
        engine.add_lane(random.Random(i))
    engine.set_runner(functools.partial(run_closed, Host(engine)))
    engine.open_gate()
    try:
        wait_for(lambda: window.successes() + window.error_count() >= count, timeout_s,
                 f"{count} requests to end")
    finally:
        engine.close_gate()
        assert engine.drained.wait(15), "in-flight requests did not drain"
        recorder.close()
        engine.stop()
    return window, engine


def kept(window: StepWindow, code: str) -> str:
    return " | ".join(window.messages.get(code, {}))


@pytest.mark.parametrize("transport", ["unary", "stream"])
def test_calls_wait_for_a_free_stream_under_max_concurrent_streams(transport: str) -> None:
    """grpc.max_concurrent_streams=2: with 6 users on unary calls every request waits its turn
    (none raises in the protocol and kills the connection); the server never has more than 2."""
    users = 6 if transport == "unary" else 2
    with Peer(options=[("grpc.max_concurrent_streams", 2)], delay_s=0.01) as peer:
        window, engine = drive(peer.address, TargetSpec(grpc=peer.address), request_bytes(),
                               users, 150, transport)
        answered = peer.servicer.answered
    assert window.error_count() == 0, window.messages
    assert window.successes() == window.sent == answered
    assert peer.servicer.max_in_flight <= 2
    assert engine.door is not None and engine.door.connects == 1


def test_stream_users_beyond_the_limit_fail_by_deadline_and_say_why() -> None:
    """transport: stream keeps one stream per user open: a third user on a 2-stream server
    never gets one. Its requests end at the deadline, counted, with the reason kept."""
    with Peer(options=[("grpc.max_concurrent_streams", 2)], delay_s=0.005) as peer:
        target = TargetSpec(grpc=peer.address, timeout_s=0.3)
        window, _ = drive(peer.address, target, request_bytes(), 3, 200)
        answered = peer.servicer.answered
    assert window.errors["t"]["DEADLINE_EXCEEDED"] >= 1
    assert "free HTTP/2 stream: the server allows 2" in kept(window, "DEADLINE_EXCEEDED")
    assert window.successes() == answered
    assert window.sent == window.successes() + window.error_count()


@pytest.mark.parametrize("transport", ["unary", "stream"])
def test_goaway_lets_started_calls_finish_and_moves_new_ones(transport: str) -> None:
    """grpc.max_connection_age_ms=300: the server sends GOAWAY every 0.3 s (grpc's graceful
    pair: last_stream_id 2^31-1, then the real one). Calls it said it will finish complete on
    the old connection; new ones go to a new connection; nothing fails."""
    options = [("grpc.max_connection_age_ms", 300), ("grpc.max_connection_age_grace_ms", 5000)]
    with Peer(options=options, delay_s=0.01) as peer:
        window, engine = drive(peer.address, TargetSpec(grpc=peer.address), request_bytes(),
                               4, 400, transport)
        answered = peer.servicer.answered
    assert engine.door is not None and engine.door.connects >= 3, "no GOAWAY was seen"
    assert window.error_count() == 0, window.messages
    assert window.successes() == window.sent == answered


def test_compressed_replies_are_internal_errors_not_successes() -> None:
    """A server that compresses (here grpcio with gzip, since the request advertised it) sends
    messages with the compressed flag; loadkit does not decompress, so each such reply is
    INTERNAL, as grpc reports a message it cannot read, and the stream is reset."""
    target = TargetSpec(grpc="", headers=(("grpc-accept-encoding", "gzip"),))
    with Peer(compression=grpc.Compression.Gzip) as peer:
        window, engine = drive(peer.address, target, request_bytes(), 2, 40)
        answered = peer.servicer.answered
    assert window.successes() == 0
    assert window.errors["t"]["INTERNAL"] == window.sent >= 40
    assert "compressed message" in kept(window, "INTERNAL")
    assert answered >= window.sent - 2  # the server answered them (the last may be reset first)


def blob_request(size: int) -> bytes:
    req = service_pb2.ModelInferRequest(model_name="blob")
    req.inputs.add(name="SIZE", datatype="INT32", shape=[1])
    req.raw_input_contents.append(np.array([size], np.int32).tobytes())
    return frame(req.SerializeToString())


def test_replies_above_the_message_limit_are_resource_exhausted(triton, control) -> None:
    """Triton's `blob` model answers SIZE bytes: 5 MB is above grpc's default 4 MB receive
    limit (RESOURCE_EXHAUSTED, the stream reset, nothing buffered past the header), 3.9 MB
    arrives whole in ~250 frames, and a raised target.max_message_size lets 5 MB through."""

    async def call(wire: Wire, payload: bytes, unary: bool) -> bytes:
        conn = await wire.connection()
        c = conn.open(INFER if unary else STREAM, unary)
        conn.send(c, payload, end_stream=unary)
        return await asyncio.wait_for(c.next_message(), 30)

    async def main() -> None:
        wire = Wire(triton.grpc_address, TargetSpec(grpc=triton.grpc_address))
        for unary in (True, False):
            with pytest.raises(InferError) as err:
                await call(wire, blob_request(5_000_000), unary)
            assert err.value.code == "RESOURCE_EXHAUSTED", err.value
            assert f"vs. {MAX_MESSAGE_BYTES}" in str(err.value)
            data = await call(wire, blob_request(3_900_000), unary)
            reply = (service_pb2.ModelInferResponse.FromString(data) if unary else
                     service_pb2.ModelStreamInferResponse.FromString(data).infer_response)
            assert len(reply.raw_output_contents[0]) == 3_900_000
        conn = await wire.connection()
        wire.close()
        big = Wire(triton.grpc_address, TargetSpec(grpc=triton.grpc_address,
                                                   max_message_bytes=8 << 20))
        reply = service_pb2.ModelInferResponse.FromString(
            await call(big, blob_request(5_000_000), True))
        assert len(reply.raw_output_contents[0]) == 5_000_000
        big.close()
        assert conn.opened == 4  # the refused replies cost their streams, not the connection

    before = control.counters(("blob",))["blob"].success
    asyncio.run(main())
    assert control.counters(("blob",))["blob"].success - before == 5


@pytest.mark.fast
def test_a_message_in_many_frames_is_kept_in_pieces_and_joined_once() -> None:
    """Receive buffering is linear in the message size: the pieces of a 4 MB message that
    arrives in 16 KB frames are kept as they came and joined once, at the end (copying the
    buffer on every frame moved ~512 MB for one 4 MB reply)."""
    body = bytes(range(256)) * (4_000_000 // 256)
    data = frame(body)
    pieces = [data[i : i + 16384] for i in range(0, len(data), 16384)]
    got: list[bytes] = []
    call = Call(1, unary=False)
    call.wait(lambda m, e: got.append(m))
    for n, piece in enumerate(pieces[:-1], 1):
        assert call.feed(piece) is None
        assert len(call.parts) == n and call.have == sum(len(p) for p in pieces[:n])
    assert call.feed(pieces[-1]) is None
    assert got == [body] and not call.parts


@pytest.mark.fast
def test_a_unary_call_that_ends_without_grpc_status_is_internal() -> None:
    """A reply with a message but no grpc-status (a proxy cut the trailers) is not a success."""
    call = Call(1, unary=True)
    call.feed(frame(b"reply"))
    errors: list[Any] = []
    call.wait(lambda m, e: errors.append((m, e)))
    call.end()
    assert errors[0][0] is None and errors[0][1].code == "INTERNAL"
    assert "grpc-status" in str(errors[0][1])


@pytest.mark.fast
def test_reset_codes_map_as_grpc_maps_them() -> None:
    import h2.errors

    from loadkit.transport.call import _reset_status

    codes = h2.errors.ErrorCodes
    assert _reset_status(codes.CANCEL) == "CANCELLED"
    assert _reset_status(codes.REFUSED_STREAM) == "UNAVAILABLE"
    assert _reset_status(codes.ENHANCE_YOUR_CALM) == "RESOURCE_EXHAUSTED"
    assert _reset_status(codes.INADEQUATE_SECURITY) == "PERMISSION_DENIED"
    assert _reset_status(codes.PROTOCOL_ERROR) == "INTERNAL"
    assert _reset_status(codes.NO_ERROR) == "INTERNAL"


def test_tls_without_h2_in_alpn_is_refused(tmp_path: Path) -> None:
    """A TLS server that does not agree to h2 (Python's ssl, no ALPN: not an HTTP/2 server at
    all) is refused at connect with what to check, as grpc refuses it; no request is sent."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca_path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            box["bytes"] = await reader.read(1 << 16)
            writer.close()

        box["server"] = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
        box["port"] = box["server"].sockets[0].getsockname()[1]
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(serve()),
                                              loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(10)
    address = f"127.0.0.1:{box['port']}"

    async def main() -> InferError:
        wire = Wire(address, TargetSpec(grpc=address, tls=TLSSpec(root_certs=ca_path)))
        with pytest.raises(InferError) as err:
            await wire.connection()
        wire.close()
        return err.value

    try:
        error = asyncio.run(main())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    assert error.code == "UNAVAILABLE" and "ALPN" in str(error), error
