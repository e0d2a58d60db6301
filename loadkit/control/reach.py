"""Why a target does not answer gRPC, in words a user can act on: nothing listening, or an
HTTP port (Triton's 8000 or 8002) where its gRPC port (usually 8001) was meant."""

from __future__ import annotations

import socket

GRPC_PORT_HINT = "Triton's gRPC port is usually 8001 (8000 is its HTTP port, 8002 its metrics)"


def refused(error: str) -> bool:
    """grpc's words for a port nothing listens on."""
    return "connection refused" in error.lower()


def speaks_http(address: str, timeout_s: float = 1.0) -> bool:
    """Whether the address answers a plain HTTP/1.1 request (the one read the check sends is a
    health GET, which changes nothing on a Triton)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: " + host.encode() +
                         b"\r\nConnection: close\r\n\r\n")
            return sock.recv(16).startswith(b"HTTP/1.")
    except (OSError, ValueError):
        return False


def unreachable_hint(address: str, error: str) -> str:
    """A sentence to add to "not reachable" for the two common mistakes ('' if neither)."""
    if refused(error):
        return f": nothing listens there (connection refused); is Triton running? {GRPC_PORT_HINT}"
    if "socket closed" in error.lower() and speaks_http(address):
        return (f": it answers HTTP, not gRPC; {GRPC_PORT_HINT}; to send over HTTP, give "
                f"--target http://{address}")
    return ""
