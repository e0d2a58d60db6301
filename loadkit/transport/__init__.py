"""gRPC on the wire: request bytes, hand-framed HTTP/2 calls, timers, admin channels.

Importable without Locust or gevent (tests/test_layout.py checks it): the engine runs these on
a native thread."""
