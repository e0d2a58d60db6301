"""Plain-Locust entry point: `locust -f locustfile.py --scenario scenarios/quickstart.yaml`."""

from loadkit.locust.locustfile import LoadkitShape, TritonUser  # noqa: F401
