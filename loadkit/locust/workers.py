"""Local worker processes for `loadkit run --workers N`: plain `loadkit worker` commands.

They are the same command a user runs on another machine, so the local and the remote case
share one code path. Each dies with its master (PR_SET_PDEATHSIG) and logs under
<report>/workers/.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadkit.control.embedded import LOOPBACK_HOSTS, free_port

__all__ = ["LocalWorkers", "free_port", "master_address"]

QUIT_WAIT_S = 15.0
PARENT_ENV = "LOADKIT_WORKER_PARENT"  # the worker dies with this pid (server.die_with_parent)


def master_address(args: argparse.Namespace) -> tuple[str, int]:
    """--workers N listens on loopback, on a free port; --master where the user said."""
    if args.workers:
        return "127.0.0.1", free_port()
    if args.master_bind_host not in LOOPBACK_HOSTS:
        print(
            f"loadkit: warning: the master listens on {args.master_bind_host}:"
            f"{args.master_port}; anyone who can reach it can join as a worker",
            file=sys.stderr,
        )
    return args.master_bind_host, args.master_port


class LocalWorkers:
    def __init__(self, args: argparse.Namespace, port: int, out_dir: Path):
        self.scenario = str(Path(args.scenario).resolve())
        self.seed = args.seed
        self.port = port
        self.log_dir = out_dir / "workers"
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, count: int) -> None:
        if not count:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "LOCUST_SKIP_MONKEY_PATCH": "1", PARENT_ENV: str(os.getpid())}
        for i in range(count):
            with open(self.log_dir / f"worker-{i}.log", "wb") as log:
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "loadkit", "worker", self.scenario,
                         "--master-host", "127.0.0.1", "--master-port", str(self.port),
                         "--seed", str(self.seed)],
                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        env=env,
                    )
                )

    def wait_connected(self, runner: Any, count: int, timeout_s: float) -> bool:
        import gevent

        deadline = time.monotonic() + timeout_s
        while len(runner.clients.ready) < count:
            if time.monotonic() >= deadline or any(p.poll() is not None for p in self.processes):
                return False
            gevent.sleep(0.1)
        return True

    def stop(self) -> None:
        """The master's quit message ends them; anything still there after that is killed."""
        deadline = time.monotonic() + QUIT_WAIT_S
        for p in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
            if p.poll() is None:
                p.kill()
                p.wait(5)
