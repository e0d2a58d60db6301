"""Drive: Locust users, the load shape, the engine that sends the inferences, and the wire.

Importing any drive module first sets LOCUST_SKIP_MONKEY_PATCH, so that a Locust imported by one
of them never monkey-patches this process (see bootstrap.py for why, and for the case where
Locust came first). Nothing is imported here: the engine and the wire stay free of Locust and
gevent.
"""

import os

os.environ.setdefault("LOCUST_SKIP_MONKEY_PATCH", "1")
