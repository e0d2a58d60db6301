"""Scenario: parse the YAML file and validate it into frozen dataclasses.

Validation is strict and exhaustive in the k6 manner: unknown keys are refused with a "did you
mean", and every problem is collected (file:line, key path, what was found, what was expected)
before one ScenarioError is raised. Nothing here talks to a server; `check_against_models` takes
model metadata that the control stage fetched.

- model.py: the frozen specs (Scenario, RequestTemplate, TargetSpec, loads, thresholds);
- checks.py: the Checker every section parses with (types, durations, sizes, files, ${VAR});
- requests.py: requests and their inputs, the mix (a template may leave inputs to the model);
- target.py: the target (address, TLS, headers, transport, what to do when it is lost);
- phases.py: phases, their loads, thresholds and requirements;
- tune.py: the `tune:` section (searched config fields, objective, constraints, budget);
- parse.py: load_scenario, the file through every section;
- against_server.py: the scenario against the server's model metadata;
- from_model.py: templates that leave inputs to the model, completed from its metadata.
"""

from loadkit.scenario.against_server import (
    ModelInfo,
    check_against_models,
    composing_models,
    decoupled_models,
    scripted_models,
    unbatched_models,
    with_model_facts,
)
from loadkit.scenario.from_model import checked_against, complete_from_models, with_inputs
from loadkit.scenario.model import (
    ARRIVALS,
    AT_LEAST_METRICS,
    DATA_KINDS,
    DTYPES,
    DURATION_METRICS,
    LATENCY_METRICS,
    MAX_CONCURRENCY,
    MAX_RATE,
    MAXIMIZED,
    STREAM_METRICS,
    THRESHOLD_METRICS,
    TRANSPORTS,
    ConcurrencyLoad,
    Dimension,
    Goodput,
    InputSpec,
    Objective,
    PhaseSpec,
    RateLoad,
    ReplayLoad,
    RequestTemplate,
    Requirements,
    Scenario,
    SequenceSpec,
    Stability,
    TargetSpec,
    Threshold,
    Thresholds,
    TLSSpec,
    TuneSpec,
    mixed_shapes,
)
from loadkit.scenario.parse import load_scenario
from loadkit.scenario.phases import parse_ramp, parse_rate_ramp

__all__ = [
    "mixed_shapes", "ARRIVALS", "AT_LEAST_METRICS", "DURATION_METRICS", "STREAM_METRICS", "Goodput",
    "DATA_KINDS", "DTYPES", "LATENCY_METRICS", "MAX_CONCURRENCY", "MAX_RATE",
    "THRESHOLD_METRICS", "TRANSPORTS", "ConcurrencyLoad", "InputSpec", "ModelInfo", "PhaseSpec",
    "RateLoad", "ReplayLoad", "RequestTemplate", "Requirements", "Scenario", "SequenceSpec",
    "TLSSpec", "Stability", "TargetSpec", "Threshold", "Thresholds", "check_against_models",
    "checked_against", "complete_from_models", "with_inputs",
    "composing_models", "load_scenario", "parse_ramp", "parse_rate_ramp", "unbatched_models",
    "with_model_facts",
    "decoupled_models", "scripted_models", "Dimension", "Objective", "TuneSpec", "MAXIMIZED",
]
