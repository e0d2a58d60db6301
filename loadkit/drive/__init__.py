"""Drive: Locust users, the load shape and the gRPC transport.

Importing this package is the one place where the process is prepared for gevent: Locust
monkey-patches on import, and grpc's gevent integration must be initialised before any channel
exists (without it, grpc inside a patched process deadlocks). Import it before creating any
grpc channel, and only in processes that will run load.
"""

import locust  # noqa: F401  (monkey-patches the process, as Locust requires)
from grpc.experimental import gevent as _grpc_gevent

_grpc_gevent.init_gevent()
