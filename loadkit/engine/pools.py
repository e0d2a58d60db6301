"""A process's prepared requests: per template a pool of request bytes as the door sends
them, and how the engine draws from it (in turn, continuing across steps, or at random),
which entry it sent (for the step's count of distinct requests and for output validation)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from loadkit.record import StepWindow
from loadkit.transport.call import InferError
from loadkit.transport.door import Outputs
from loadkit.transport.validate import mismatch


class Pools:
    def __init__(self, pools: Sequence[Sequence[bytes]], names: Sequence[str],
                 random_order: Sequence[bool] | None = None):
        self.pools = [list(pool) for pool in pools]
        self.first = [pool[0] for pool in self.pools]
        self.names = list(names)
        # per template, `order: random` (else each pool is sent in turn)
        self.random_order = list(random_order) if random_order else [False] * len(self.pools)
        self.cursors = [0] * len(self.pools)
        # (template, entry) of the request draw() gave last, until a send takes it (a request
        # sent without a fresh draw, such as a sequence's closing END, is not validated)
        self.last_drawn: tuple[int, int] | None = None
        # validate: true: per template, per entry, the outputs expected (None: no check)
        self.expected: list[list[dict[str, Any]] | None] = [None] * len(self.pools)
        self.validating = False
        # shared memory: (template, entry, expected) -> the outputs as the server wrote them
        # in the entry's region (the response carries none); None: read from the response
        self.shm_read: Callable[[int, int, dict[str, Any]], Outputs] | None = None
        # per template, a data set's sequences (perf_analyzer's sequence form) as (first
        # entry, length), handed out in turn; [] where the template has none
        self.sequences: list[list[tuple[int, int]]] = [[] for _ in self.pools]
        self.sequence_cursors = [0] * len(self.pools)

    def set_sequences(self, lengths: Sequence[Sequence[int]]) -> None:
        """Each template's data set sequences, by their lengths in file order."""
        for i, lens in enumerate(lengths):
            starts, at = [], 0
            for n in lens:
                starts.append((at, n))
                at += n
            self.sequences[i] = starts

    def next_sequence(self, i: int, rng: random.Random) -> tuple[int, int] | None:
        """(Engine thread.) Template i's next data set sequence: (first entry, length), in
        turn (order: random: at random); None when the template has none."""
        seqs = self.sequences[i]
        if not seqs:
            return None
        if self.random_order[i]:
            return seqs[rng.randrange(len(seqs))]
        k = self.sequence_cursors[i]
        self.sequence_cursors[i] = k + 1 if k + 1 < len(seqs) else 0
        return seqs[k]

    def draw_at(self, i: int, j: int, window: StepWindow | None) -> bytes:
        """(Engine thread.) Entry j of template i's pool (a data set sequence's step)."""
        if window is not None:
            window.use(self.names[i], j)
        self.last_drawn = (i, j)
        return self.pools[i][j]

    def take_check(self) -> tuple[int, int] | None:
        """(Engine thread.) What the request being sent must be validated against, if any."""
        drawn, self.last_drawn = self.last_drawn, None
        return drawn if self.validating else None

    def expect(self, expected: list[list[dict[str, Any]] | None]) -> None:
        self.expected = expected
        self.validating = any(e is not None for e in expected)

    @property
    def pooled(self) -> bool:
        return self.validating or any(len(pool) > 1 for pool in self.pools)

    def draw(self, i: int, rng: random.Random, window: StepWindow | None) -> bytes:
        """(Engine thread.) Template i's next request; the window notes which one."""
        pool = self.pools[i]
        n = len(pool)
        if n == 1:
            self.last_drawn = (i, 0)
            return pool[0]
        if self.random_order[i]:
            j = rng.randrange(n)
        else:
            j = self.cursors[i]
            self.cursors[i] = j + 1 if j + 1 < n else 0
        if window is not None:
            window.use(self.names[i], j)
        self.last_drawn = (i, j)
        return pool[j]

    def validate(self, outputs: Outputs, check: tuple[int, int]) -> InferError | None:
        """MISMATCH when the response differs from what entry `check` expects."""
        expected = self.expected[check[0]]
        if expected is None:
            return None
        want = expected[check[1]]
        if self.shm_read is not None:
            outputs = self.shm_read(check[0], check[1], want)
        why = mismatch(outputs, want)
        return None if why is None else InferError("MISMATCH", why)
