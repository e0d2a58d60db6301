"""A real grpcio server (grpc's own HTTP/2 stack) that implements the two KServe inference
methods loadkit's wire uses, for the conditions Triton cannot be made to produce: a stream limit
(`grpc.max_concurrent_streams`), GOAWAY (`grpc.max_connection_age_ms`), compressed responses.
It answers every request with a small ModelInferResponse after `delay_s`, counts what it
answered, and records the most calls it ever had in flight."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc


class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.answered = 0
        self.in_flight = 0
        self.max_in_flight = 0

    def _answer(self, request: service_pb2.ModelInferRequest) -> service_pb2.ModelInferResponse:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
            out = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
            out.outputs.add(name="OUTPUT0", datatype="UINT8", shape=[4096])
            out.raw_output_contents.append(bytes(4096))  # compressible, for the gzip test
            return out
        finally:
            with self.lock:
                self.in_flight -= 1
                self.answered += 1

    def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802 (grpc's name)
        return self._answer(request)

    def ModelStreamInfer(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:  # noqa: N802
        for request in requests:
            yield service_pb2.ModelStreamInferResponse(infer_response=self._answer(request))


class Peer:
    """`with Peer(options=[...]) as peer:` serves on 127.0.0.1:`peer.port`."""

    def __init__(self, options: list[tuple[str, Any]] | None = None, delay_s: float = 0.0,
                 compression: grpc.Compression | None = None, workers: int = 16):
        self.servicer = Servicer(delay_s)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                                  options=options or [], compression=compression)
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Peer:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None)


def request_bytes() -> bytes:
    req = service_pb2.ModelInferRequest(model_name="peer")
    tensor = req.inputs.add(name="INPUT0", datatype="UINT8", shape=[4])
    req.raw_input_contents.append(b"\x01\x02\x03\x04")
    del tensor
    return req.SerializeToString()
