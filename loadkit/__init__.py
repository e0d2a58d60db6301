"""loadkit: scenario-driven load testing for NVIDIA Triton Inference Server.

The package reads as the pipeline: scenario (parse + validate) -> plan (phases and steps as
plain data) -> drive (Locust users, shape, transport) -> record (HDR) -> control (Triton configs,
server statistics) -> report (JSON, Markdown).
"""

__version__ = "0.1.0"

import os as _os

# grpc's C core prints every failed TLS handshake at INFO level, a line per retry, around the one
# clear error loadkit gives; a user's own GRPC_VERBOSITY still wins.
_os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
