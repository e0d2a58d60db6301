"""`repeats: auto`: interleaved rounds are added until every comparison is decided, and the
intervals keep their stated level across the looks.

Looking after every round and stopping at the first decisive answer would, at a fixed 95%,
raise the false-alarm rate with each look. The design is a group-sequential t test with a
Pocock-type constant nominal level (Pocock 1977, Biometrika 64(2); Jennison & Turnbull,
*Group Sequential Methods with Applications to Clinical Trials*, 2000, ch. 2 and 9): every look
judges at one nominal level alpha' chosen so that, with no real change, the chance that *any*
look's interval excludes 0 is alpha. The intervals at each look are then repeated confidence
intervals (Jennison & Turnbull 1989, JRSS B 51(3)): they hold at 1 - alpha simultaneously over
every look, so `same` (equivalence) and `better`/`worse` may both be read at whichever look
the run stops. alpha' depends only on the looks (the rounds at which a decision may be taken):
the paired t statistic is scale-free, so it is found by simulating normal round differences
once, with a fixed seed (tests/verdicts/test_sequential.py checks the rate it keeps).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy import special

from loadkit.scenario.model import DEFAULT_AUTO_ROUNDS as DEFAULT_MAX_ROUNDS
from loadkit.scenario.model import MIN_AUTO_ROUNDS as MIN_ROUNDS  # 2 rounds: 1 degree of freedom

SIMULATIONS = 100_000
_SEED = 20261207
_CHUNK = 20_000


@dataclass(frozen=True)
class Design:
    """When a run may stop adding rounds, and the level each look judges at."""

    confidence: float  # the stated level: what holds over all the looks together
    looks: tuple[int, ...]  # the rounds after which the run looks
    nominal: float  # each look's own level (1 - alpha'), above `confidence`

    @property
    def max_rounds(self) -> int:
        return self.looks[-1]

    def describe(self) -> str:
        return (f"group-sequential, Pocock-type constant nominal level: looks after rounds "
                f"{self.looks[0]}..{self.looks[-1]}, each at {self.nominal:.2%} so that "
                f"{self.confidence:.0%} holds across all of them")


def design(confidence: float, max_rounds: int = DEFAULT_MAX_ROUNDS,
           min_rounds: int = MIN_ROUNDS) -> Design:
    """The design for looks after every round from `min_rounds` to `max_rounds`."""
    first = min(max(2, min_rounds), max_rounds)
    looks = tuple(range(first, max_rounds + 1))
    return Design(confidence, looks, 1.0 - nominal_alpha(1.0 - confidence, looks))


@functools.lru_cache(maxsize=32)
def nominal_alpha(alpha: float, looks: tuple[int, ...]) -> float:
    """The two-sided level alpha' each look's t test uses so that, with no change and normal
    round differences, P(some look rejects) = alpha. One look needs no adjustment."""
    if len(looks) <= 1:
        return alpha
    rng = np.random.default_rng(_SEED)
    smallest: list[np.ndarray] = []
    for start in range(0, SIMULATIONS, _CHUNK):
        rows = min(_CHUNK, SIMULATIONS - start)
        x = rng.standard_normal((rows, looks[-1]))
        total, squares = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
        p_min = np.ones(rows)
        for n in looks:
            mean = total[:, n - 1] / n
            var = np.maximum((squares[:, n - 1] - n * mean**2) / (n - 1), 1e-300)
            t = mean / np.sqrt(var / n)
            p_min = np.minimum(p_min, 2.0 * special.stdtr(n - 1, -np.abs(t)))
        smallest.append(p_min)
    return float(np.quantile(np.concatenate(smallest), alpha))
