"""Which door a target is reached through: an address's scheme picks it (host:port is gRPC,
http://host:port and https://host:port HTTP/REST), one entry per door (door.py says what a
door is)."""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from loadkit.scenario import TargetSpec
from loadkit.transport.door import Door, Encoder
from loadkit.transport.grpc_door import GrpcDoor, GrpcEncoder
from loadkit.transport.http_door import HttpDoor, HttpEncoder

DOORS: dict[str, tuple[type[Encoder], type[Door]]] = {
    "grpc": (GrpcEncoder, GrpcDoor),
    "http": (HttpEncoder, HttpDoor),
}


class Endpoint(NamedTuple):
    protocol: str  # a key of DOORS
    host_port: str
    tls: bool  # https://: TLS for HTTP (gRPC's TLS is target.tls)


def endpoint(address: str) -> Endpoint:
    """The door and host:port an address names."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        return Endpoint("grpc", address, False)
    rest = rest.rstrip("/")
    if scheme == "grpc":
        return Endpoint("grpc", rest, False)
    return Endpoint("http", rest, scheme == "https")


def encoder_for(address: str, target: TargetSpec) -> Encoder:
    """The encoder whose bytes the door of `address` sends."""
    where = endpoint(address)
    return DOORS[where.protocol][0](target, where.host_port)  # type: ignore[call-arg]


def open_door(address: str, *, target: TargetSpec, loop: asyncio.AbstractEventLoop,
              unary: bool = False) -> Door:
    """The door of `address` on the engine's loop (it connects on first use)."""
    where = endpoint(address)
    return DOORS[where.protocol][1](  # type: ignore[call-arg]
        address=where.host_port, target=target, loop=loop, unary=unary, tls=where.tls)
