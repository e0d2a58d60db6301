"""gRPC channels to a target for control's admin calls (inferences go over transport/wire.py).

Kept apart from control's modules so that every admin client gets the same TLS and options.
"""

from __future__ import annotations

import grpc

from loadkit.scenario import TargetSpec

MAX_MESSAGE_BYTES = 256 * 1024 * 1024


OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # A server that comes back (on_server_loss: wait) is found within ~2 s, not grpc's
    # default backoff of up to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def _credentials(target: TargetSpec) -> grpc.ChannelCredentials | None:
    tls = target.tls
    if tls is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=tls.root_certs.read_bytes() if tls.root_certs else None,
        private_key=tls.client_key.read_bytes() if tls.client_key else None,
        certificate_chain=tls.client_cert.read_bytes() if tls.client_cert else None,
    )


def make_channel(address: str, target: TargetSpec) -> grpc.Channel:
    """A blocking channel, for admin calls (control)."""
    creds = _credentials(target)
    if creds is None:
        return grpc.insecure_channel(address, options=OPTIONS)
    return grpc.secure_channel(address, creds, options=OPTIONS)

