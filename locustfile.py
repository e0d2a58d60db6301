"""Plain-Locust entry point: `locust -f locustfile.py --scenario scenarios/quickstart.yaml`."""

from loadkit.drive.locustfile import LoadkitShape, TritonUser  # noqa: F401
