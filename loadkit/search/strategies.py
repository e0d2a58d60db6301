"""How the next config is chosen: `brute` (the whole grid), `quick` (climb one dimension at a
time from the smallest config, Model Analyzer's quick search), `bayes` (optuna's TPE, seeded).

A strategy proposes points and is told each one's trial (None: refused by the server or not
measured); it never measures a point twice: what --resume brings back counts as told.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from loadkit.search.score import better
from loadkit.search.space import Point, gray_order, neighbours

Trial = dict[str, Any]
MAX_REPEATS = 200  # bayes: proposals of known points in a row before the space counts as done


class Strategy:
    name = ""

    def __init__(self, radix: tuple[int, ...], seed: int = 0):
        self.radix = radix
        self.seed = seed
        self.told: dict[Point, Trial | None] = {}

    def propose(self) -> Point | None:
        raise NotImplementedError

    def tell(self, point: Point, trial: Trial | None) -> None:
        self.told[point] = trial


class Brute(Strategy):
    """Every point, in Gray-code order: one dimension (one model reload) changes per trial."""

    name = "brute"

    def __init__(self, radix: tuple[int, ...], seed: int = 0):
        super().__init__(radix, seed)
        self._order = gray_order(radix)

    def propose(self) -> Point | None:
        for point in self._order:
            if point not in self.told:
                return point
        return None


class Quick(Strategy):
    """Coordinate ascent: from the first value of every dimension, step one dimension up (then
    down) while the trial improves; stop after a pass over every dimension with no gain."""

    name = "quick"

    def __init__(self, radix: tuple[int, ...], seed: int = 0):
        super().__init__(radix, seed)
        self._walk = self._climb()
        self._want: Point | None = None

    def _climb(self) -> Iterator[Point]:
        current: Point = tuple(0 for _ in self.radix)
        if current not in self.told:
            yield current
        improved = True
        while improved:
            improved = False
            for dim in range(len(self.radix)):
                for direction in (1, -1):
                    while (nxt := neighbours(self.radix, current, dim, direction)) is not None:
                        if nxt not in self.told:
                            yield nxt
                        if not better(self.told.get(nxt), self.told.get(current)):
                            break
                        current, improved = nxt, True

    def propose(self) -> Point | None:
        return next(self._walk, None)

    @property
    def best(self) -> Point | None:
        known = [(p, t) for p, t in self.told.items() if t is not None]
        if not known:
            return None
        best = known[0]
        for p, t in known[1:]:
            if better(t, best[1]):
                best = (p, t)
        return best[0]


class Bayes(Strategy):
    """optuna's TPE sampler over the value indices (ordered, so neighbours are near), seeded;
    constraints go to the sampler as optuna constraints, refused configs as failed trials."""

    name = "bayes"

    def __init__(self, radix: tuple[int, ...], seed: int = 0):
        super().__init__(radix, seed)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        sampler = optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=max(3, min(10, len(radix) * 2)))
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self._pending: dict[Point, Any] = {}
        self._total = 1
        for r in radix:
            self._total *= r

    def _dist(self) -> dict[str, Any]:
        d = self._optuna.distributions
        return {f"d{i}": d.IntDistribution(0, r - 1) for i, r in enumerate(self.radix)}

    def _record(self, ot: Any, trial: Trial | None) -> None:
        from optuna.trial import TrialState

        point = trial.get("point") if trial else None
        if point is None:
            self.study.tell(ot, state=TrialState.FAIL)
            return
        ot.set_constraint("constraints", 0.0 if point["constraints_met"] else 1.0)
        self.study.tell(ot, point["score"])

    def propose(self) -> Point | None:
        for _ in range(MAX_REPEATS):
            if len(self.told) >= self._total:
                return None
            ot = self.study.ask(self._dist())
            point = tuple(int(ot.params[f"d{i}"]) for i in range(len(self.radix)))
            if point in self.told:  # known: tell the sampler again, measure nothing
                self._record(ot, self.told[point])
                continue
            self._pending[point] = ot
            return point
        # the sampler keeps proposing measured points: the rest of the grid in order
        return next((p for p in gray_order(self.radix) if p not in self.told), None)

    def tell(self, point: Point, trial: Trial | None) -> None:
        super().tell(point, trial)
        ot = self._pending.pop(point, None)
        if ot is not None:
            self._record(ot, trial)
        else:  # resumed (or proposed outside the sampler): teach the sampler what it was
            self._record_at(point, trial)

    def _record_at(self, point: Point, trial: Trial | None) -> None:
        ft = self._optuna.trial
        params = {f"d{i}": v for i, v in enumerate(point)}
        p = trial.get("point") if trial else None
        if p is None:
            self.study.add_trial(ft.create_trial(params=params, distributions=self._dist(),
                                                 state=ft.TrialState.FAIL))
            return
        self.study.add_trial(ft.create_trial(
            params=params, distributions=self._dist(), value=p["score"],
            constraints={"constraints": 0.0 if p["constraints_met"] else 1.0}))


STRATEGIES: dict[str, type[Strategy]] = {"brute": Brute, "quick": Quick, "bayes": Bayes}
