"""The Locust user: closed-loop gRPC inferences picked from the scenario's weighted mix."""

from __future__ import annotations

import time
from typing import Any

import grpc
from locust import User, task

from loadkit.drive.context import DriveContext


class TritonUser(User):
    """Sends the scenario's requests back to back (plus think time) while the gate is open.

    The user blocks on the gate inside `wait_time`, i.e. while Locust considers it *waiting*, so
    Locust can stop it there at once; a request is never interrupted half way.
    """

    def on_start(self) -> None:
        self.ctx: DriveContext = self.environment.loadkit.drive  # type: ignore[attr-defined]
        self.rng = self.ctx.user_rng()
        self.transport = self.ctx.open_transport()
        self.fire = self.environment.events.request.fire

    def wait_time(self) -> float:
        self.ctx.gate.wait()
        return self.ctx.think_time_s

    @task
    def infer(self) -> None:
        ctx = self.ctx
        if not ctx.gate.is_set():
            return
        i = ctx.pick(self.rng) if len(ctx.payloads) > 1 else 0
        name = ctx.template_names[i]
        window = ctx.recorder.window
        ctx.inflight += 1
        exc: Any = None
        size = 0
        t0 = time.perf_counter_ns()
        try:
            size = self.transport.infer(ctx.payloads[i])
        except grpc.RpcError as e:
            exc = e
        finally:
            elapsed_us = (time.perf_counter_ns() - t0) // 1000
            ctx.request_done()
        if exc is None:
            if window is not None:
                window.record(name, elapsed_us)
        else:
            code = exc.code().name if hasattr(exc, "code") and exc.code() else "UNKNOWN"
            if window is not None:
                window.error(name, code)
            exc = RuntimeError(f"{code}: {exc.details() if hasattr(exc, 'details') else exc}")
        self.fire(
            request_type="grpc",
            name=name,
            response_time=elapsed_us / 1000.0,
            response_length=size,
            exception=exc,
            context=None,
        )
