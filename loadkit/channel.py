"""gRPC channels to a target, shared by the drive stage (inferences) and control (admin calls).

Kept apart from both so that importing control never imports the drive package (which
monkey-patches the process for gevent).
"""

from __future__ import annotations

import grpc

from loadkit.scenario import TargetSpec

MAX_MESSAGE_BYTES = 256 * 1024 * 1024


def make_channel(address: str, target: TargetSpec) -> grpc.Channel:
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    if target.tls is None:
        return grpc.insecure_channel(address, options=options)
    tls = target.tls
    creds = grpc.ssl_channel_credentials(
        root_certificates=tls.root_certs.read_bytes() if tls.root_certs else None,
        private_key=tls.client_key.read_bytes() if tls.client_key else None,
        certificate_chain=tls.client_cert.read_bytes() if tls.client_cert else None,
    )
    return grpc.secure_channel(address, creds, options=options)
