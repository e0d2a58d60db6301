"""`llm:` request templates: an LLM served by Triton, in the vLLM backend's or TensorRT-LLM's
input conventions, with prompts from a file or synthetic ones of a seeded length, and a
requested output length per request. The template becomes an ordinary pool of distinct
prepared requests (one data set entry each), so the hot path still sends prepared bytes.

    llm:
      style: vllm                 # or tensorrt_llm
      prompts: prompts.jsonl      # or synthetic: input_tokens: {mean: 128, stddev: 32}
      output_tokens: {mean: 64, stddev: 8}
      count: 200                  # distinct requests (default: the file's prompts, or 100)
      tokenizer: tokenizer.json   # optional: exact token counts (the `tokenizers` library)

Without a tokenizer a token is a whitespace-separated word (what the shipped simulator counts);
with one, synthetic prompts are cut to the exact token count and every prompt is counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadkit.errors import DatasetError
from loadkit.scenario.checks import Checker, found
from loadkit.scenario.model import (
    DATASET_MAX_BYTES,
    ENDPOINTS,
    DatasetSpec,
    InputSpec,
    RequestTemplate,
)
from loadkit.scenario.mooncake import prompt, read_rows
from loadkit.scenario.source import KeyPath

STYLES = ("vllm", "tensorrt_llm")
KEYS = ("style", "prompts", "input_tokens", "output_tokens", "count", "seed", "tokenizer",
        "sampling_parameters", "trace")
DEFAULT_COUNT = 100
MAX_COUNT = 100_000
# synthetic prompts draw their words from here (seeded): plain words, one token each for the
# simulator, a few tokens each for a real tokenizer
SENTENCE = ("the model serves requests under load while the scheduler batches tokens for every "
            "user in the queue and the server reports its latency throughput memory and "
            "errors so an engineer can compare configurations before a launch")
WORDS = tuple(SENTENCE.split())


@dataclass(frozen=True, kw_only=True)
class LlmSpec:
    """What the report needs to know about an LLM template's requests."""

    style: str
    count: int
    input_tokens_mean: float  # over the pool: what input tokens/s is computed from
    output_tokens_mean: float  # requested (max_tokens)
    tokens_by: str  # "words" or the tokenizer file's name
    tokenizer: Path | None = None  # the user's tokenizer.json: exact input and output tokens


def load_tokenizer(path: Path) -> Any:
    """The `tokenizers` library's Tokenizer from the user's file (nothing downloaded)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def _lengths(ck: Checker, raw: Any, path: KeyPath) -> tuple[float, float] | None:
    """`64` or `{mean: 64, stddev: 8}`."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw >= 1:
            return float(raw), 0.0
        ck.add(path, f"expected a token count >= 1 or {{mean: N, stddev: S}}; found {raw}")
        return None
    m = ck.mapping(raw, path, ("mean", "stddev"), ("mean",))
    if m is None or "mean" not in m:
        return None
    mean = ck.number(m["mean"], (*path, "mean"), 1, False)
    sd = ck.number(m.get("stddev", 0), (*path, "stddev"), 0, False)
    return None if mean is None or sd is None else (mean, sd)


def _draw(rng: random.Random, mean_sd: tuple[float, float]) -> int:
    mean, sd = mean_sd
    return max(1, round(rng.gauss(mean, sd) if sd else mean))


def _prompts_from(ck: Checker, name: str, path: KeyPath) -> list[str] | None:
    """JSON Lines (a string, or an object with text_input / prompt / text) or plain text,
    one prompt per line."""
    file = ck.file(name, path)
    if file is None:
        return None
    out = []
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        ck.add(path, f"cannot read {name}: {exc}")
        return None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if file.suffix != ".jsonl":
            out.append(line)
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            ck.add(path, f"{name}:{i}:{exc.colno}: {exc.msg}")
            return None
        if isinstance(item, dict):
            item = next((item[k] for k in ("text_input", "prompt", "text") if k in item), None)
        if not isinstance(item, str):
            ck.add(path, f"{name}:{i}: expected a string or an object with text_input, prompt "
                         f"or text; found {found(item)}")
            return None
        out.append(item)
    if not out:
        ck.add(path, f"{name}: no prompts in the file")
        return None
    return out


def _tokenizer(ck: Checker, name: Any, path: KeyPath) -> tuple[Any, Path | None]:
    file = ck.file(name, path)
    if file is None:
        return None, None
    try:
        return load_tokenizer(file), file
    except Exception as exc:  # the library raises its own Exception type for a bad file
        ck.add(path, f"{name}: not a tokenizer.json the tokenizers library can read ({exc})")
        return None, None


def llm_template(ck: Checker, raw: Any, path: KeyPath
                 ) -> tuple[tuple[InputSpec, ...], DatasetSpec, LlmSpec] | None:
    """The inputs, the pool of requests and the facts of an `llm:` template."""
    m = ck.mapping(raw, path, KEYS, ("style",))
    if m is None or "style" not in m:
        return None
    style = ck.choice(m, "style", path, STYLES, "vllm")
    seed = ck.integer(m.get("seed", 0), (*path, "seed"), 0) or 0
    tok, tok_file = (_tokenizer(ck, m["tokenizer"], (*path, "tokenizer")) if "tokenizer" in m
                     else (None, None))
    prompts = None
    if "trace" in m:
        return _trace_template(ck, m, path, style, tok, tok_file)
    if "prompts" in m and "input_tokens" in m:
        ck.add((*path, "input_tokens"), "prompts come from the file; expected either "
                                        "'prompts' or 'input_tokens', found both")
    if "prompts" in m:
        prompts = _prompts_from(ck, m["prompts"], (*path, "prompts"))
    inputs_len = _lengths(ck, m.get("input_tokens", 128), (*path, "input_tokens"))
    outputs_len = _lengths(ck, m.get("output_tokens", 64), (*path, "output_tokens"))
    default = len(prompts) if prompts else DEFAULT_COUNT
    count = ck.integer(m.get("count", default), (*path, "count"), 1, MAX_COUNT)
    sampling = m.get("sampling_parameters", {})
    if not isinstance(sampling, dict):
        ck.add((*path, "sampling_parameters"), f"expected a mapping (sent as JSON); found "
                                               f"{found(sampling)}")
    elif style != "vllm" and sampling:
        ck.add((*path, "sampling_parameters"), "sampling_parameters is the vLLM backend's "
                                               "input; expected it only with style: vllm")
    if ("prompts" in m and prompts is None) or None in (inputs_len, outputs_len, count) or \
            not isinstance(sampling, dict):
        return None
    assert inputs_len is not None and outputs_len is not None and count is not None
    rng = random.Random(seed)
    texts, counts, wanted = [], [], []
    for i in range(count):
        if prompts is not None:
            text = prompts[i % len(prompts)]
        else:
            n = _draw(rng, inputs_len)
            text = " ".join(rng.choice(WORDS) for _ in range(n))
            if tok is not None:  # cut where the n-th token ends in the text
                text = _cut(tok, text, n)
        texts.append(text)
        counts.append(len(tok.encode(text).ids) if tok is not None else len(text.split()))
        wanted.append(_draw(rng, outputs_len))
    specs, entries = _style_inputs(style, texts, wanted, sampling)
    file = Path(m["prompts"]).name if prompts is not None else "synthetic prompts"
    dataset = DatasetSpec(file=ck.base_dir / file, max_bytes=DATASET_MAX_BYTES,
                          entries=tuple(entries))
    facts = LlmSpec(style=style, count=count, input_tokens_mean=sum(counts) / count,
                    output_tokens_mean=sum(wanted) / count,
                    tokens_by="words" if tok is None else Path(str(m["tokenizer"])).name,
                    tokenizer=tok_file)
    return specs, dataset, facts


def _cut(tok: Any, text: str, n: int) -> str:
    """`text` cut where its n-th token ends (a tokenizer's tokens, not words)."""
    offsets = tok.encode(text).offsets
    return text[:offsets[min(n, len(offsets)) - 1][1]]


def _trace_template(ck: Checker, m: dict[str, Any], path: KeyPath, style: str, tok: Any,
                    tok_file: Path | None
                    ) -> tuple[tuple[InputSpec, ...], DatasetSpec, LlmSpec] | None:
    """`llm: {trace: FILE}`: one request per line of a mooncake trace, its prompt built from
    the line's hash_ids and input_length, its max_tokens the line's output_length."""
    for key in ("prompts", "input_tokens", "output_tokens", "count"):
        if key in m:
            ck.add((*path, key), f"the trace gives each request's lengths; expected no '{key}' "
                                 "beside 'trace'")
    file = ck.file(m["trace"], (*path, "trace"))
    sampling = m.get("sampling_parameters", {})
    if file is None or not isinstance(sampling, dict):
        return None
    try:
        rows = read_rows(file)
    except (DatasetError, OSError, UnicodeDecodeError) as exc:
        ck.add((*path, "trace"), str(exc))
        return None
    blocks: dict[int, list[str]] = {}
    texts, counts = [], []
    for i, row in enumerate(rows):
        text = prompt(row, WORDS, blocks, i)
        if tok is not None:
            text = _cut(tok, text, row.input_length)
        texts.append(text)
        counts.append(len(tok.encode(text).ids) if tok is not None else row.input_length)
    wanted = [r.output_length for r in rows]
    specs, entries = _style_inputs(style, texts, wanted, sampling)
    dataset = DatasetSpec(file=file, max_bytes=DATASET_MAX_BYTES, entries=tuple(entries))
    n = len(rows)
    facts = LlmSpec(style=style, count=n, input_tokens_mean=sum(counts) / n,
                    output_tokens_mean=sum(wanted) / n,
                    tokens_by="words" if tok is None else Path(str(m["tokenizer"])).name,
                    tokenizer=tok_file)
    return specs, dataset, facts


def _style_inputs(style: str, texts: list[str], wanted: list[int],
                  sampling: dict[str, Any]) -> tuple[tuple[InputSpec, ...], list[dict[str, Any]]]:
    """The backend's inputs (dims [1] each) and one entry per request."""
    def text(value: str) -> np.ndarray:
        return np.array([value.encode()], dtype=object)

    def flag(value: bool) -> np.ndarray:
        return np.array([value], dtype=np.bool_)

    names = ["text_input", "stream", "exclude_input_in_output"]
    names.append("sampling_parameters" if style == "vllm" else "max_tokens")
    dtypes = {"text_input": "BYTES", "stream": "BOOL", "exclude_input_in_output": "BOOL",
              "sampling_parameters": "BYTES", "max_tokens": "INT32"}
    specs = tuple(InputSpec(name=n, dtype=dtypes[n], shape=(1,), data="dataset") for n in names)
    entries = []
    for t, n in zip(texts, wanted, strict=True):
        e = {"text_input": text(t), "stream": flag(True), "exclude_input_in_output": flag(True)}
        if style == "vllm":
            params = {**sampling, "max_tokens": n, "ignore_eos": True}
            e["sampling_parameters"] = text(json.dumps(params))
        else:
            e["max_tokens"] = np.array([n], dtype=np.int32)
        entries.append(e)
    return specs, entries


def llm_request(ck: Checker, name: str, m: dict[str, Any], path: KeyPath, order: str,
                parameters: tuple[tuple[str, Any], ...]) -> RequestTemplate | None:
    """A template with `llm:`: its inputs and pool come from the llm section."""
    for key in ("inputs", "dataset", "pool", "batch_size", "validate", "sequence"):
        if key in m:
            ck.add((*path, key), f"an llm template builds its own inputs and requests; "
                                 f"expected no '{key}'")
    model = ck.string(m.get("model"), (*path, "model"), "a model name")
    built = llm_template(ck, m["llm"], (*path, "llm"))
    outputs = m.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        ck.add((*path, "outputs"), f"expected a list of output names; found {found(outputs)}")
        outputs = []
    composing = m.get("composing_models", [])
    if not isinstance(composing, list) or not all(isinstance(c, str) and c for c in composing):
        ck.add((*path, "composing_models"), f"expected a list of model names; found "
                                            f"{found(composing)}")
        composing = []
    if model is None or built is None:
        return None
    inputs, dataset, facts = built
    return RequestTemplate(name=name, model=model, batch_size=1, inputs=inputs,
                           outputs=tuple(outputs), version=str(m.get("version", "")),
                           dataset=dataset, order=order, parameters=parameters, llm=facts,
                           composing=tuple(composing))


def with_cancel(ck: Checker, raw: Any, path: KeyPath,
                template: RequestTemplate | None) -> RequestTemplate | None:
    """`cancel: {after: 3, share: 10%}`: that share of the template's requests (drawn per
    request, seeded) is cancelled by the client after its first N responses (a decoupled
    model's; checked against the server)."""
    if template is None or not isinstance(raw, dict) or "cancel" not in raw:
        return template
    p = (*path, "cancel")
    m = ck.mapping(raw["cancel"], p, ("after", "share"), ("after",))
    if m is None or "after" not in m:
        return template
    after = ck.integer(m["after"], (*p, "after"), 1)
    share = m.get("share", 1.0)
    if isinstance(share, str) and share.endswith("%"):
        with contextlib.suppress(ValueError):
            share = float(share[:-1]) / 100
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        ck.add((*p, "share"), f"expected a share above 0 and at most 1 (or 100%); found "
                              f"{found(m.get('share'))}")
        return template
    return None if after is None else dataclasses.replace(template, cancel=(after, float(share)))


def with_endpoint(ck: Checker, raw: Any, path: KeyPath,
                  template: RequestTemplate | None) -> RequestTemplate | None:
    """`endpoint: generate | generate_stream`: the template goes to Triton's generate extension
    (HTTP only: checked against the target), its inputs as the JSON fields of one request."""
    if template is None or not isinstance(raw, dict) or "endpoint" not in raw:
        return template
    endpoint = ck.choice(raw, "endpoint", path, ENDPOINTS, "infer")
    if endpoint != "infer":
        for key, why in (("sequence", "a sequence's flags are infer request parameters"),
                         ("validate", "validation reads infer responses")):
            if key in raw:
                ck.add((*path, key), f"endpoint: {endpoint} sends JSON fields to the generate "
                                     f"extension; {why}: use endpoint: infer (the default)")
    return dataclasses.replace(template, endpoint=endpoint)
