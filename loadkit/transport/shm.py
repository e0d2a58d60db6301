"""System shared memory regions (POSIX shm under /dev/shm, mapped with mmap), as Triton's
shared-memory extension reads them: the client writes a tensor at an offset of a region it
registered, and a request names the region, offset and size instead of carrying the bytes.

Names carry the creating process's pid (`loadkit-<pid>-<n>`), so regions a killed process left
behind are found and removed by whoever looks next (`stale`): the run's end, the next run's
start.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import re
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "loadkit-"
NAME = re.compile(r"^loadkit-(\d+)-\d+$")
_counter = itertools.count()


class Region:
    """One region this process created: written once at start, read for validation."""

    def __init__(self, size: int):
        self.name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.key = f"/{self.name}"  # what Triton opens (shm_open)
        self.size = max(1, size)
        fd = os.open(SHM_DIR / self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, self.size)
            self.map = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.used = 0

    def put(self, data: bytes) -> int:
        """Write `data` at the next free offset (64-byte aligned); its offset."""
        at = self.used
        self.map[at:at + len(data)] = data
        self.used = -(-(at + len(data)) // 64) * 64
        return at

    def read(self, offset: int, size: int) -> bytes:
        return bytes(self.map[offset:offset + size])

    def close(self) -> None:
        """Unmap and unlink (idempotent)."""
        if not self.map.closed:
            self.map.close()
        with contextlib.suppress(FileNotFoundError):
            (SHM_DIR / self.name).unlink()


def aligned(sizes: list[int]) -> int:
    """The region size that holds `sizes` written one after another by `put`."""
    return sum(-(-s // 64) * 64 for s in sizes)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale(names: list[str]) -> list[str]:
    """Of `names` (regions registered on a server, or files under /dev/shm), loadkit's whose
    creating process is gone."""
    out = []
    for name in names:
        m = NAME.match(name)
        if m and not alive(int(m.group(1))):
            out.append(name)
    return out


def stale_files() -> list[str]:
    """loadkit regions under /dev/shm whose process is gone."""
    try:
        names = [p.name for p in SHM_DIR.iterdir() if p.name.startswith(PREFIX)]
    except OSError:
        return []
    return stale(names)


def unlink(names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (SHM_DIR / name).unlink()
