"""Templates completed from the model's metadata, as perf_analyzer fills its requests: every
input a template leaves out is sent as random data of the model's dtype and shape, an input
a data set names takes its values from the file, and a listed input without a dtype takes the
model's. The completed template is parsed again by the same checks as a written one, so a
completed scenario is refused or accepted exactly as its written form would be (`loadkit init`
writes that form). A template of a sequence-batching model that says nothing of its
sequences gets perf_analyzer's (length 20, +-20%), as `-m` on such a model runs in perf_analyzer:
the completed template carries them, and `loadkit init` writes them out."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from loadkit.errors import Problem, ScenarioError, suggest
from loadkit.scenario.against_server import ModelInfo, check_against_models
from loadkit.scenario.checks import Checker
from loadkit.scenario.datasets import DatasetError, dataset_names
from loadkit.scenario.llm import with_cancel, with_endpoint
from loadkit.scenario.model import Scenario
from loadkit.scenario.requests import _template
from loadkit.scenario.source import KeyPath

# perf_analyzer's --sequence-length and --sequence-length-variation defaults
SEQUENCE_DEFAULTS = {"length": 20, "length_variation": 20}


def checked_against(scenario: Scenario, models: dict[str, ModelInfo | str]) -> Scenario:
    """The scenario completed from, and checked against, the server's models: ScenarioError
    with every problem of both."""
    try:
        scenario = complete_from_models(scenario, models)
        problems: list[Problem] = []
    except ScenarioError as exc:
        problems = list(exc.problems)
    problems += [p for p in check_against_models(scenario, models) if p not in problems]
    if problems:
        raise ScenarioError(problems)
    return scenario


def complete_from_models(scenario: Scenario, models: dict[str, ModelInfo | str]) -> Scenario:
    """The scenario with every pending template completed; ScenarioError lists what cannot be
    (a variable dimension without a shape, a data set that does not fit the model). A template
    whose model the server lacks stays pending: check_against_models says why."""
    base = scenario.path.resolve().parent
    problems: list[Problem] = []
    filled: dict[str, dict[str, Any]] = {}
    for name, t in scenario.requests.items():
        info = models.get(t.model)
        if t.pending is None or not isinstance(info, ModelInfo):
            continue
        inputs, found = filled_inputs(name, t.pending, info, base)
        problems += [scenario.source.problem(where, msg) for where, msg in found]
        if not found:
            filled[name] = {"inputs": inputs}
            if info.sequence and not info.decoupled and "sequence" not in t.pending:
                filled[name]["sequence"] = dict(SEQUENCE_DEFAULTS)
    try:
        done = with_inputs(scenario, filled)
    except ScenarioError as exc:
        problems += exc.problems
    if problems:
        raise ScenarioError(problems)
    return done


def with_inputs(scenario: Scenario, filled: dict[str, dict[str, Any]]) -> Scenario:
    """Pending templates parsed again with their completed keys (`inputs:`, and `sequence:` for
    a sequence model that named none; a worker is sent the master's, so both send the same
    requests)."""
    base = scenario.path.resolve().parent
    problems: list[Problem] = []
    requests = dict(scenario.requests)
    for name, keys in filled.items():
        t = scenario.requests[name]
        path: KeyPath = ("requests", name)
        ck = Checker(scenario.source, base)
        raw = {**t.pending, **keys}
        done = with_endpoint(ck, raw, path,
                             with_cancel(ck, raw, path, _template(ck, name, raw, path)))
        problems += ck.problems
        if done is not None:
            requests[name] = dataclasses.replace(done, filled=keys)
    if problems:
        raise ScenarioError(problems)
    return dataclasses.replace(scenario, requests=requests)


def filled_inputs(template: str, raw: dict[str, Any], info: ModelInfo, base: Path
                  ) -> tuple[dict[str, dict[str, Any]], list[tuple[KeyPath, str]]]:
    """The template's `inputs:` mapping with what it leaves out taken from the model, in the
    model's order, and the problems: an input the model lacks, a variable shape not given."""
    listed = raw.get("inputs") if isinstance(raw.get("inputs"), dict) else {}
    from_file, problems = _dataset_inputs(template, raw, info, base)
    out: dict[str, dict[str, Any]] = {}
    for name, (dtype, dims) in info.inputs.items():
        given = dict(listed.get(name) or {})
        if name not in listed and name not in from_file and name in info.optional:
            continue
        given.setdefault("dtype", "BYTES" if dtype == "STRING" else dtype)
        if name in from_file:
            given.setdefault("data", "dataset")
        if given.get("data") != "dataset" and "shape" not in given and "shapes" not in given:
            shape = list(dims[1:] if info.max_batch_size else dims)
            if any(d < 0 for d in shape):
                problems.append((("requests", template, "inputs"), (
                    f"input '{name}' of model '{info.name}' has a variable shape {shape} "
                    f"(without the batch dimension); expected a shape for it: --shape "
                    f"{name}:{','.join('16' if d < 0 else str(d) for d in shape)} on the "
                    f"command line, or inputs: {{{name}: {{shape: [...]}}}} in the template")))
                continue
            given["shape"] = shape
        out[name] = given
    for name in listed:
        if name not in info.inputs:
            problems.append((("requests", template, "inputs", name), (
                f"model '{info.name}' has no input '{name}'{suggest(name, info.inputs)} (has: "
                f"{', '.join(info.inputs)})")))
    return out, problems


def _dataset_inputs(template: str, raw: dict[str, Any], info: ModelInfo, base: Path
                    ) -> tuple[set[str], list[tuple[KeyPath, str]]]:
    """The model inputs the template's data set gives values for."""
    ds = raw.get("dataset")
    file = ds.get("file") if isinstance(ds, dict) else ds
    if not isinstance(file, str):
        return set(), []
    try:
        names = dataset_names((base / file).resolve())
    except (DatasetError, OSError, ValueError):
        return set(), []  # the full parse says why
    if not names:  # one unnamed input: the model's only required one
        required = [n for n in info.inputs if n not in info.optional]
        return set(required[:1]) if len(required) == 1 else set(), []
    extra = [n for n in names if n not in info.inputs]
    if extra:
        return set(), [(("requests", template, "dataset"), (
            f"{Path(file).name} gives input{'s' if len(extra) > 1 else ''} "
            f"{', '.join(extra)}, which model '{info.name}' does not take (it takes "
            f"{', '.join(info.inputs)})"))]
    return set(names), []
