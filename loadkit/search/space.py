"""The config space of a `tune:` section: points (one value index per dimension), the order a
full grid is walked in, and the overlay each point puts on each model."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from loadkit.modelconfig import set_path
from loadkit.scenario import Dimension

Point = tuple[int, ...]  # an index into each dimension's values, in the section's order


def sizes(dims: tuple[Dimension, ...]) -> tuple[int, ...]:
    return tuple(len(d.values) for d in dims)


def gray_order(radix: tuple[int, ...]) -> Iterator[Point]:
    """Every point of the grid, each differing from the one before in one dimension only
    (reflected mixed-radix Gray code): a full grid then reloads one model per trial."""
    n = len(radix)
    point = [0] * n
    step = [1] * n
    total = 1
    for r in radix:
        total *= r
    for _ in range(total):
        yield tuple(point)
        for d in range(n - 1, -1, -1):  # the last dimension moves fastest
            nxt = point[d] + step[d]
            if 0 <= nxt < radix[d]:
                point[d] = nxt
                break
            step[d] = -step[d]  # reflect this digit and carry into the one before


def neighbours(radix: tuple[int, ...], point: Point, dim: int, direction: int) -> Point | None:
    i = point[dim] + direction
    if not 0 <= i < radix[dim]:
        return None
    return (*point[:dim], i, *point[dim + 1:])


def values(dims: tuple[Dimension, ...], point: Point) -> dict[str, Any]:
    """{'dense.instance_group.count': 2, ...}"""
    return {d.name: d.values[i] for d, i in zip(dims, point, strict=True)}


def overlays(dims: tuple[Dimension, ...], point: Point,
             originals: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model, the overlay that sets this point's values on its original config. Each
    touched top-level field is given whole (instance_group keeps its kind and devices)."""
    out: dict[str, dict[str, Any]] = {}
    by_model: dict[str, list[tuple[str, Any]]] = {}
    for d, i in zip(dims, point, strict=True):
        by_model.setdefault(d.model, []).append((d.path, d.values[i]))
    for model, items in by_model.items():
        desired = copy.deepcopy(originals[model])
        for path, value in items:
            set_path(desired, path, value)
        out[model] = {p.split(".")[0]: desired[p.split(".")[0]] for p, _ in items}
    return out
