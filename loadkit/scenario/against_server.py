"""The scenario against the server's model metadata: what only a running Triton can tell."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from loadkit.errors import Problem, suggest
from loadkit.scenario.model import InputSpec, RequestTemplate, Scenario
from loadkit.scenario.source import KeyPath


@dataclass(frozen=True)
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


def check_against_models(scenario: Scenario, models: dict[str, ModelInfo | str]) -> list[Problem]:
    """Compare templates with server metadata; a str value is the server's reason it has none."""
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
        if info.decoupled and scenario.target.transport == "unary":
            problems.append(
                src.problem(("target", "transport"), f"model '{t.model}' is decoupled (its "
                            "responses stream back over ModelStreamInfer); expected transport "
                            "stream, found unary")
            )
            continue
        if t.cancel is not None and not info.decoupled:
            problems.append(src.problem((*base, "cancel"), f"model '{t.model}' is not decoupled "
                                        "(one response a request); expected 'cancel' only for "
                                        "a streaming model"))
        if info.decoupled and (t.validate or t.sequence is not None):
            key = "validate" if t.validate else "sequence"
            problems.append(src.problem((*base, key), f"model '{t.model}' is decoupled; loadkit "
                                        f"does not combine streaming with '{key}' yet; "
                                        f"expected no '{key}'"))
            continue
        if info.sequence and t.sequence is None:
            problems.append(
                src.problem((*base, "model"), f"model '{t.model}' uses sequence batching "
                            "(every request needs a correlation id and START/END flags); "
                            "expected the template to say so: sequence: {length: N}")
            )
            continue
        if t.sequence is not None and not info.sequence:
            problems.append(
                src.problem((*base, "sequence"), f"model '{t.model}' has no sequence_batching; "
                            "expected no 'sequence' for it")
            )
        elif t.sequence is not None and info.corrid_type:
            sent = "STRING" if t.sequence.id_type == "string" else "UINT64"
            declared = "STRING" if info.corrid_type == "STRING" else "UINT64"
            if sent != declared:
                problems.append(src.problem(
                    (*base, "sequence", "id_type"), f"model '{t.model}' declares its "
                    f"correlation id as TYPE_{info.corrid_type}; expected id_type "
                    f"{'string' if declared == 'STRING' else 'uint64'}, found "
                    f"{t.sequence.id_type}"))
        if info.max_batch_size == 0 and t.batch_size != 1:
            problems.append(
                src.problem(
                    (*base, "batch_size"),
                    f"model '{t.model}' does not batch (max_batch_size 0); "
                    f"expected 1, found {t.batch_size}",
                )
            )
        elif info.max_batch_size and t.batch_size > info.max_batch_size:
            problems.append(
                src.problem(
                    (*base, "batch_size"),
                    f"expected at most model '{t.model}''s max_batch_size {info.max_batch_size}; "
                    f"found {t.batch_size}",
                )
            )
        given = {i.name: i for i in t.inputs}
        if t.llm is not None:
            sent = {n: dtype for n, (dtype, _) in info.inputs.items()}
            wrong = [i.name for i in t.inputs if i.name not in sent or (
                sent[i.name] != i.dtype and {sent[i.name], i.dtype} != {"BYTES", "STRING"})]
            missing = [n for n in info.inputs if n not in given and n not in info.optional]
            if wrong or missing:
                problems.append(src.problem((*base, "llm", "style"), (
                    f"style {t.llm.style} sends " + ", ".join(
                        f"{i.name} ({i.dtype})" for i in t.inputs) + f"; model '{t.model}' "
                    "takes " + ", ".join(f"{n} ({d})" for n, d in sent.items()) +
                    "; expected a model with the style's inputs (docs/streaming.md)")))
                continue
        for name in given:
            if name not in info.inputs:
                hint = suggest(name, info.inputs)
                problems.append(
                    src.problem(
                        (*base, "inputs", name),
                        f"model '{t.model}' has no input '{name}'{hint} "
                        f"(has: {', '.join(info.inputs)})",
                    )
                )
        for name, (dtype, dims) in info.inputs.items():
            p: KeyPath = (*base, "inputs", name)
            if name not in given:
                if name not in info.optional:
                    problems.append(src.problem(
                        (*base, "inputs"), f"input '{name}' of model '{t.model}' is missing"))
                continue
            spec = given[name]
            if spec.dtype != dtype:
                problems.append(
                    src.problem(
                        (*p, "dtype"), f"model '{t.model}' expects {dtype}; found {spec.dtype}"
                    )
                )
            want = dims[1:] if info.max_batch_size else dims
            for shape, origin in _shapes_sent(t, spec):
                if len(want) != len(shape) or any(
                    w not in (-1, s) for w, s in zip(want, shape, strict=True)
                ):
                    problems.append(
                        src.problem(
                            (*p, "shapes" if spec.shapes else "shape") if origin == "" else
                            (*base, "dataset"),
                            f"model '{t.model}' expects shape {list(want)} (without the batch "
                            f"dimension); found {list(shape)}{origin}",
                        )
                    )
                    break
        checked = {name for entry in (t.dataset.expected if t.validate and t.dataset else ())
                   for name in entry}
        unknown = sorted(checked - set(info.outputs))
        if unknown:
            problems.append(src.problem(
                (*base, "validate"), f"{t.dataset.file.name if t.dataset else ''}'s "
                f"validation_data names output{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(repr(u) for u in unknown)}; model '{t.model}' has outputs "
                f"{', '.join(info.outputs)}"))
        for out in t.outputs:
            if out not in info.outputs:
                problems.append(
                    src.problem(
                        (*base, "outputs"),
                        f"model '{t.model}' has no output '{out}' (has: {', '.join(info.outputs)})",
                    )
                )
    return problems


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
