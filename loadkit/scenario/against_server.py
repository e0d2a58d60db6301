"""The scenario against the server's model metadata: what only a running Triton can tell."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from loadkit.errors import Problem, suggest
from loadkit.scenario.model import InputSpec, RequestTemplate, Scenario
from loadkit.scenario.source import KeyPath


@dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """What the server says about one model: enough to check a template against it."""

    name: str
    max_batch_size: int
    inputs: dict[str, tuple[str, tuple[int, ...]]]
    outputs: dict[str, tuple[str, tuple[int, ...]]]
    decoupled: bool = False  # model_transaction_policy.decoupled: several responses a request
    sequence: bool = False  # sequence_batching: requests need correlation ids
    composing: tuple[str, ...] = ()  # an ensemble's steps, in order
    optional: frozenset[str] = frozenset()  # inputs the config marks `optional: true`
    # the data type of the correlation id its sequence batcher declares (CONTROL_SEQUENCE_
    # CORRID: "UINT64", "STRING"; "" when the config declares none)
    corrid_type: str = ""
    backend: str = ""  # "python" models may call any other model from their code (BLS)


def unbatched_models(models: dict[str, ModelInfo | str]) -> list[str]:
    return sorted(m for m, i in models.items() if isinstance(i, ModelInfo) and
                  i.max_batch_size == 0)


def decoupled_models(models: dict[str, ModelInfo | str]) -> list[str]:
    return sorted(m for m, i in models.items() if isinstance(i, ModelInfo) and i.decoupled)


def scripted_models(models: dict[str, ModelInfo | str]) -> list[str]:
    """Models whose code may call other models (python backend: BLS)."""
    return sorted(m for m, i in models.items() if isinstance(i, ModelInfo) and
                  i.backend == "python")


def composing_models(models: dict[str, ModelInfo | str]) -> dict[str, tuple[str, ...]]:
    """Each ensemble's composing models, as its config lists them."""
    return {m: i.composing for m, i in models.items() if isinstance(i, ModelInfo) and i.composing}


def with_model_facts(scenario: Scenario, unbatched: list[str],
                     composing: dict[str, tuple[str, ...]] | None = None,
                     decoupled: list[str] | None = None,
                     scripted: list[str] | None = None) -> Scenario:
    """The scenario with what only the server knows: which templates' models do not batch,
    which stream several responses a request (decoupled), which models an ensemble runs
    (a template's own `composing_models` come first: BLS calls are not in any config), and
    which may call other models from their code (`scripted`)."""
    composing = composing or {}
    streamed = set(decoupled or ())
    requests = {
        n: dataclasses.replace(t, batched=t.model not in unbatched,
                               composing=t.composing or composing.get(t.model, ()),
                               composing_known=t.composing_known or (
                                   not t.composing and bool(composing.get(t.model))),
                               decoupled=t.model in streamed,
                               scripted=t.model in set(scripted or ()))
        for n, t in scenario.requests.items()
    }
    return dataclasses.replace(scenario, requests=requests)


Found = list[tuple[KeyPath, str]]  # (where in the scenario, what is wrong)


def check_against_models(scenario: Scenario, models: dict[str, ModelInfo | str]) -> list[Problem]:
    """Compare templates with server metadata; a str value is the server's reason it has none.
    Each aspect is its own check; a template whose model cannot take it at all (missing, or a
    kind that cannot be sent so) stops at that one problem."""
    src = scenario.source
    problems: list[Problem] = []
    for t in scenario.requests.values():
        base: KeyPath = ("requests", t.name)
        info = models.get(t.model)
        if info is None or isinstance(info, str):
            reason = f": {info}" if isinstance(info, str) else ""
            problems.append(
                src.problem((*base, "model"), f"the server has no ready model '{t.model}'{reason}")
            )
            continue
        found, blocking = _kind(t, info, base, scenario.target.transport)
        if not blocking:
            found += _batch(t, info, base)
            llm = _llm(t, info, base) if t.llm is not None else []
            found += llm or [*_inputs(t, info, base), *_outputs(t, info, base)]
        problems += [src.problem(where, message) for where, message in found]
    return problems


def _kind(t: RequestTemplate, info: ModelInfo, base: KeyPath, transport: str
          ) -> tuple[Found, bool]:
    """Streaming and sequence batching against what the template asks: (problems, whether
    they block every further check)."""
    model = f"model '{t.model}'"
    if info.decoupled and transport == "unary":
        return [(("target", "transport"), f"{model} is decoupled (its responses stream back "
                 "over ModelStreamInfer); expected transport stream, found unary")], True
    out: Found = []
    if t.cancel is not None and not info.decoupled:
        out.append(((*base, "cancel"), f"{model} is not decoupled (one response a request); "
                    "expected 'cancel' only for a streaming model"))
    if info.decoupled and (t.validate or t.sequence is not None):
        key = "validate" if t.validate else "sequence"
        out.append(((*base, key), f"{model} is decoupled; loadkit does not combine streaming "
                    f"with '{key}' yet; expected no '{key}'"))
        return out, True
    if info.sequence and t.sequence is None:
        out.append(((*base, "model"), f"{model} uses sequence batching (every request needs a "
                    "correlation id and START/END flags); expected the template to say so: "
                    "sequence: {length: N}"))
        return out, True
    if t.sequence is not None and not info.sequence:
        out.append(((*base, "sequence"), f"{model} has no sequence_batching; expected no "
                    "'sequence' for it"))
    elif t.sequence is not None and info.corrid_type:
        sent = "STRING" if t.sequence.id_type == "string" else "UINT64"
        declared = "STRING" if info.corrid_type == "STRING" else "UINT64"
        if sent != declared:
            out.append(((*base, "sequence", "id_type"), f"{model} declares its correlation id "
                        f"as TYPE_{info.corrid_type}; expected id_type "
                        f"{'string' if declared == 'STRING' else 'uint64'}, found "
                        f"{t.sequence.id_type}"))
    return out, False


def _batch(t: RequestTemplate, info: ModelInfo, base: KeyPath) -> Found:
    if info.max_batch_size == 0 and t.batch_size != 1:
        return [((*base, "batch_size"), f"model '{t.model}' does not batch (max_batch_size 0); "
                 f"expected 1, found {t.batch_size}")]
    if info.max_batch_size and t.batch_size > info.max_batch_size:
        return [((*base, "batch_size"), f"expected at most model '{t.model}''s max_batch_size "
                 f"{info.max_batch_size}; found {t.batch_size}")]
    return []


def _llm(t: RequestTemplate, info: ModelInfo, base: KeyPath) -> Found:
    """An `llm:` template's style against the model's inputs (one problem naming both)."""
    given = {i.name for i in t.inputs}
    sent = {n: dtype for n, (dtype, _) in info.inputs.items()}
    wrong = [i.name for i in t.inputs if i.name not in sent or (
        sent[i.name] != i.dtype and {sent[i.name], i.dtype} != {"BYTES", "STRING"})]
    missing = [n for n in info.inputs if n not in given and n not in info.optional]
    if not wrong and not missing:
        return []
    return [((*base, "llm", "style"), f"style {t.llm.style} sends " + ", ".join(
        f"{i.name} ({i.dtype})" for i in t.inputs) + f"; model '{t.model}' takes " + ", ".join(
        f"{n} ({d})" for n, d in sent.items()) + "; expected a model with the style's inputs "
        "(docs/streaming.md)")]


def _inputs(t: RequestTemplate, info: ModelInfo, base: KeyPath) -> Found:
    """Every input: named by the model, of its dtype, in a shape it takes."""
    out: Found = []
    given = {i.name: i for i in t.inputs}
    for name in given:
        if name not in info.inputs:
            out.append(((*base, "inputs", name), f"model '{t.model}' has no input '{name}'"
                        f"{suggest(name, info.inputs)} (has: {', '.join(info.inputs)})"))
    for name, (dtype, dims) in info.inputs.items():
        p: KeyPath = (*base, "inputs", name)
        if name not in given:
            if name not in info.optional:
                out.append(((*base, "inputs"), f"input '{name}' of model '{t.model}' is "
                            "missing"))
            continue
        spec = given[name]
        if spec.dtype != dtype:
            out.append(((*p, "dtype"), f"model '{t.model}' expects {dtype}; found {spec.dtype}"))
        want = dims[1:] if info.max_batch_size else dims
        for shape, origin in _shapes_sent(t, spec):
            if len(want) != len(shape) or any(
                    w not in (-1, s) for w, s in zip(want, shape, strict=True)):
                where = ((*p, "shapes" if spec.shapes else "shape") if origin == ""
                         else (*base, "dataset"))
                out.append((where, f"model '{t.model}' expects shape {list(want)} (without the "
                            f"batch dimension); found {list(shape)}{origin}"))
                break
    return out


def _outputs(t: RequestTemplate, info: ModelInfo, base: KeyPath) -> Found:
    """Outputs asked for, and those `validate` compares, must be the model's."""
    out: Found = []
    checked = {name for entry in (t.dataset.expected if t.validate and t.dataset else ())
               for name in entry}
    unknown = sorted(checked - set(info.outputs))
    if unknown:
        out.append(((*base, "validate"), f"{t.dataset.file.name if t.dataset else ''}'s "
                    f"validation_data names output{'s' if len(unknown) > 1 else ''} "
                    f"{', '.join(repr(u) for u in unknown)}; model '{t.model}' has outputs "
                    f"{', '.join(info.outputs)}"))
    for name in t.outputs:
        if name not in info.outputs:
            out.append(((*base, "outputs"), f"model '{t.model}' has no output '{name}' (has: "
                        f"{', '.join(info.outputs)})"))
    return out


def _shapes_sent(t: RequestTemplate, spec: InputSpec) -> list[tuple[tuple[int, ...], str]]:
    """Every shape the template sends for an input (without the batch dimension), with where
    it comes from ('' for the template itself)."""
    if spec.shape is not None and spec.data != "dataset":
        return [(spec.shape, "")]
    if spec.shapes:
        return [(shape, "") for shape, _ in spec.shapes]
    if t.dataset is None:
        return []
    seen: dict[tuple[int, ...], int] = {}
    for i, entry in enumerate(t.dataset.entries):
        seen.setdefault(tuple(entry[spec.name].shape), i)
    return [(shape, f" in {t.dataset.file.name} entry {i + 1} (input '{spec.name}')")
            for shape, i in seen.items()]
