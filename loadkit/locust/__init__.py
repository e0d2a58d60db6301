"""Locust's side: the users and the shape, the locustfile and its web UI tab, the local and the
distributed drives, local worker processes, and bootstrap.py (how Locust and gevent may touch
this process).

Importing any module here first sets LOCUST_SKIP_MONKEY_PATCH, so that a Locust imported by one
of them never monkey-patches this process (see bootstrap.py for why, and for the case where
Locust came first). Nothing else is imported here.
"""

import os

os.environ.setdefault("LOCUST_SKIP_MONKEY_PATCH", "1")
