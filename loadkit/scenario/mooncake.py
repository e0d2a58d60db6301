"""AIPerf's mooncake trace (JSON Lines, one request a line: `timestamp` in ms, `input_length`
and `output_length` in tokens, `hash_ids`: the ids of the prompt's KV-cache blocks, shared
between requests that share a prefix). The replay reads the timestamps (scenario/traffic.py);
an `llm: {trace: FILE}` template reads the lengths and builds each line's request
(scenario/llm.py), so the k-th line's arrival sends the k-th line's prompt and max_tokens.
Upstream aliases are read too: input_tokens, output_tokens, created_time."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadkit.errors import DatasetError

BLOCK_TOKENS = 512  # mooncake's block size: hash_ids name blocks of this many tokens
MAX_ROWS = 100_000


@dataclass(frozen=True, kw_only=True)
class Row:
    t_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def looks_like(first_line: str) -> bool:
    """Whether a JSON Lines file's first line is a mooncake row."""
    try:
        row = json.loads(first_line)
    except ValueError:
        return False
    return isinstance(row, dict) and ("timestamp" in row or "created_time" in row) and any(
        k in row for k in ("input_length", "input_tokens", "hash_ids"))


def read_rows(path: Path, limit: int = MAX_ROWS) -> list[Row]:
    """The file's rows in order (timestamps must not go back); DatasetError with file:line."""
    rows: list[Row] = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            text = line.strip()
            if not text:
                continue
            if len(rows) == limit:
                raise DatasetError(f"{path.name}:{n}: more than {limit} requests; at most "
                                   f"{limit} are read (cut the file, or narrow its window)")
            rows.append(_row(path, n, text, rows[-1].t_s if rows else None))
    if not rows:
        raise DatasetError(f"{path.name}: no requests in the file")
    return rows


def _row(path: Path, n: int, text: str, before: float | None) -> Row:
    where = f"{path.name}:{n}"
    try:
        raw: Any = json.loads(text)
    except ValueError as exc:
        raise DatasetError(f"{where}: not JSON ({exc.msg}); expected a mooncake row such as "
                           '{"timestamp": 0, "input_length": 512, "output_length": 64}') from None
    if not isinstance(raw, dict):
        raise DatasetError(f"{where}: expected a JSON object per line; found {text[:40]!r}")
    t = raw.get("timestamp", raw.get("created_time"))
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise DatasetError(f"{where}: expected 'timestamp' in milliseconds (>= 0); found "
                           f"{t!r}")
    t_s = float(t) / 1000.0
    if before is not None and t_s < before:
        raise DatasetError(f"{where}: timestamp {t} ms is before the line above's "
                           f"({before * 1000:g} ms); expected them in order")
    ids = raw.get("hash_ids", [])
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                            for i in ids):
        raise DatasetError(f"{where}: expected 'hash_ids' as a list of integers; found "
                           f"{str(ids)[:40]}")
    if not any(k in raw for k in ("input_length", "input_tokens", "hash_ids")) and any(
            k in raw for k in ("text_input", "messages", "payload")):
        raise DatasetError(f"{where}: rows with verbatim text_input / messages are not read "
                           "(yet); expected 'input_length' (and hash_ids) as mooncake has them")
    inp = raw.get("input_length", raw.get("input_tokens", len(ids) * BLOCK_TOKENS))
    out = raw.get("output_length", raw.get("output_tokens"))
    for key, v in (("input_length", inp), ("output_length", out)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise DatasetError(f"{where}: expected '{key}' as a whole number of tokens >= 1; "
                               f"found {v!r}")
    return Row(t_s=t_s, input_length=int(inp), output_length=int(out), hash_ids=tuple(ids))


def prompt(row: Row, words: tuple[str, ...], blocks: dict[int, list[str]], line: int) -> str:
    """The row's prompt: its blocks' words (each hash id a seeded block of BLOCK_TOKENS words,
    so rows that share ids share a prefix, as the trace's cache hits need), cut to its
    input_length; rows without ids get words seeded by their line."""
    out: list[str] = []
    for block in row.hash_ids:
        got = blocks.get(block)
        if got is None:
            rng = random.Random(block * 1_000_003 + 17)
            got = blocks[block] = [rng.choice(words) for _ in range(BLOCK_TOKENS)]
        out += got
        if len(out) >= row.input_length:
            break
    if len(out) < row.input_length:
        rng = random.Random(-line - 1)
        out += [rng.choice(words) for _ in range(row.input_length - len(out))]
    return " ".join(out[:row.input_length])
