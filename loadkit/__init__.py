"""loadkit: scenario-driven load testing for NVIDIA Triton Inference Server.

The package reads as the pipeline: scenario (parse + validate) -> plan (phases and steps as
plain data) -> drive (Locust users, shape, transport) -> record (HDR) -> control (Triton configs,
server statistics) -> report (JSON, Markdown).
"""

__version__ = "0.1.0"
