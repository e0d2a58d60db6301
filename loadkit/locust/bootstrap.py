"""The one place that decides how Locust and gevent may touch this process.

loadkit's inferences run on a native thread, an asyncio loop that frames gRPC over HTTP/2 itself
(engine.py, wire.py). That needs a process that gevent has *not* monkey-patched: patched sockets
and threads would put the engine back on the gevent hub. Locust skips its patching when
LOCUST_SKIP_MONKEY_PATCH is set: `loadkit/locust/__init__.py` sets it before any drive module can
import Locust, and `loadkit run` / `loadkit ui` / `loadkit worker` import this module first.
Plain `locust -f` has imported (and patched) before it reads the locustfile; the locustfile then
re-executes the same command line with the variable set (`reexec_unpatched`), before anything
has started.
"""

import os
import sys

import gevent.monkey
import locust  # noqa: F401  (imported here first, with the variable set, so it does not patch)

PATCHED = gevent.monkey.is_module_patched("socket")
PATCHED_MESSAGE = (
    "Locust monkey-patched this process before loadkit was imported, and loadkit's gRPC engine "
    "cannot run on patched sockets. Start Locust as: LOCUST_SKIP_MONKEY_PATCH=1 locust -f "
    "locustfile.py --scenario FILE."
)
REEXEC_FLAG = "LOADKIT_REEXEC"


def reexec_unpatched() -> None:
    """Replace a patched process with the same command, unpatched (once; never loops)."""
    if not PATCHED or os.environ.get(REEXEC_FLAG):
        return
    env = {**os.environ, "LOCUST_SKIP_MONKEY_PATCH": "1", REEXEC_FLAG: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
