"""gRPC for inferences, framed over one HTTP/2 connection (the h2 library) on the engine's loop.

Why not grpc.aio: on the bench its per-request machinery (a call object, a completion-queue
poller thread and a cross-thread wake-up for every message) cost several times perf_analyzer's
client CPU per inference (docs/performance.md), taken from a server that shares the cores.
Here a request is one prepared gRPC message written as a DATA frame, a burst of responses is
one socket read, and writes made in one loop iteration leave in one `write`. h2 keeps the
HTTP/2 rules (settings, flow control, HPACK, pings); connection.py maps gRPC onto it, call.py
holds one call. This module keeps the engine's link: one live connection, a new one after a
loss (with grpc's backoff), TLS with ALPN h2.
"""

from __future__ import annotations

import asyncio
import ssl
import time

from loadkit.scenario import TargetSpec
from loadkit.transport.call import InferError
from loadkit.transport.connection import BACKOFF_S, STREAMS_PER_CONNECTION, Connection


class Wire:
    """The engine's link to the target: one connection, replaced after a loss with a backoff."""

    def __init__(self, address: str, target: TargetSpec):
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.authority = address
        self.target = target
        self.conn: Connection | None = None
        self.retired: set[Connection] = set()  # finishing their calls (close() ends them all)
        self.connects = 0
        self._connecting: asyncio.Future[Connection] | None = None
        self._retry_at = 0.0
        self._backoff = BACKOFF_S[0]

    def live(self) -> Connection | None:
        """The connection new calls go on, if there is one now."""
        conn = self.conn
        if conn is None or conn.closed:
            return None
        if conn.goaway:  # it finishes its streams on its own, then closes
            self.retired.add(conn)
            self.conn = None
            return None
        if conn.opened >= STREAMS_PER_CONNECTION:
            conn.retire()
            self.retired.add(conn)
            self.conn = None
            return None
        return conn

    async def connection(self) -> Connection:
        """The live connection, or a new one; while the server is unreachable, callers wait for
        the next attempt (so a lane fails once per backoff, not in a busy loop)."""
        conn = self.live()
        if conn is not None:
            return conn
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        try:
            return await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _connect(self) -> Connection:
        wait = self._retry_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: Connection(self.authority, self.target),
                    self.host, self.port, ssl=self._ssl(),
                    server_hostname=self.host if self.target.tls else None,
                ),
                self.target.timeout_s,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_S[1])
            raise InferError("UNAVAILABLE", f"cannot connect to {self.authority}: {exc}") from None
        if self.target.tls:
            ssl_object = conn.transport.get_extra_info("ssl_object") if conn.transport else None
            chosen = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
            if chosen != "h2":  # as grpc: gRPC needs HTTP/2, which TLS must have agreed on
                conn.close()
                self._retry_at = time.monotonic() + self._backoff
                raise InferError("UNAVAILABLE", f"{self.authority} did not agree to HTTP/2 over "
                                 f"TLS (ALPN chose {chosen!r}, expected 'h2')")
        # As grpc does, send nothing before the server's SETTINGS: until then its stream limit
        # is unknown, and streams opened past it come back refused.
        try:
            await asyncio.wait_for(asyncio.shield(conn.settled), self.target.timeout_s)
        except asyncio.TimeoutError:
            conn.close()
            raise InferError("UNAVAILABLE", f"{self.authority} sent no HTTP/2 SETTINGS within "
                             f"{self.target.timeout_s:g} s (not a gRPC server?)") from None
        if conn.closed:
            raise InferError("UNAVAILABLE", f"{self.authority} closed the connection at once")
        self._backoff = BACKOFF_S[0]
        self.conn = conn
        self.connects += 1
        self.retired = {c for c in self.retired if not c.closed}
        return conn

    def _ssl(self) -> ssl.SSLContext | None:
        tls = self.target.tls
        if tls is None:
            return None
        ctx = ssl.create_default_context(cafile=str(tls.root_certs) if tls.root_certs else None)
        if tls.client_cert and tls.client_key:
            ctx.load_cert_chain(str(tls.client_cert), str(tls.client_key))
        ctx.set_alpn_protocols(["h2"])
        return ctx

    def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
        for conn in (self.conn, *self.retired):
            if conn is not None:
                conn.close()
        self.conn = None
        self.retired.clear()
