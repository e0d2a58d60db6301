"""What each command's --help says beside its options: examples, and its own exit codes (every
command maps its outcomes to them in cli/, through loadkit/exits.py)."""

from __future__ import annotations

INTERRUPTED = "  130, 143  interrupted (Ctrl-C, SIGTERM): the report so far is written"
BAD = "  2  bad input (scenario, flags, data set) or a target that cannot be used; nothing was sent"
CODES = {
    "run": ["  0  the run completed, every threshold held (and with --baseline, no regression)",
            "  1  the run failed (an accounting mismatch, nothing measured, a step not stable, "
            "...), a threshold or SLO failed, or --baseline's gate caught a regression",
            BAD, INTERRUPTED],
    "capacity": ["  0  every phase was searched (found, approximate or not found: the table "
                 "says which)",
                 "  1  the run failed (an accounting mismatch, a lost server, ...)", BAD,
                 INTERRUPTED],
    "tune": ["  0  a best config kept every constraint: best/<model>/config.pbtxt written",
             "  1  no config kept the constraints, or the run failed", BAD, INTERRUPTED],
    "validate": ["  0  the scenario is valid (the plan is printed)",
                 "  2  the scenario has problems (each with file:line), or --target cannot be "
                 "used"],
    "compare": ["  0  the comparison was written (with --fail-on: no comparison caught)",
                "  1  --fail-on caught a comparison (a regression, or an inconclusive one when "
                "asked)",
                "  2  a report folder cannot be read, or the flags are wrong"],
    "report": ["  0  the report folder was rendered again",
               "  2  its results.json or histograms.json cannot be read"],
    "init": ["  0  the scenario file was written", BAD],
    "worker": ["  0  the master ended the run",
               "  1  no master answered, or the run failed", BAD, INTERRUPTED],
    "serve": ["  1  tritonserver exited by itself", BAD, INTERRUPTED],
    "trace": ["  0  the trace was taken and its parts named",
              "  1  the server could not trace (its trace settings were refused)", BAD,
              INTERRUPTED],
    "ui": ["  0  the web UI was stopped", BAD, INTERRUPTED],
}


def exit_codes(command: str) -> str:
    lines = CODES.get(command) or ["  0  success", "  1  failed", BAD]
    return "exit codes:\n" + "\n".join(lines)


EXAMPLES = {
    "run": """examples:
  loadkit run -m dense                                 # the embedded Triton, concurrency 1
  loadkit run -m resnet -u 127.0.0.1:8001 --concurrency-range 1:16:2
  loadkit run -m bert -u 127.0.0.1:8001 --input-data data.json --rate 100:500:100
  loadkit run scenarios/quickstart.yaml --repeats 3    # a scenario file: phases, configs, SLOs
  loadkit run scenarios/quickstart.yaml --target 127.0.0.1:8001 --workers 2

The report folder (reports/<UTC time>-<name>/, or --out) holds summary.md (printed at the end),
report.html, results.json, steps.csv and the plots.""",
    "capacity": """examples:
  loadkit capacity scenarios/capacity.yaml --slo 'p99<50ms' --peak 3000/s
  loadkit capacity -m dense --rate 200 --slo 'p99<5ms' --peak 5000/s""",
    "tune": """examples:
  loadkit tune scenarios/tune.yaml --strategy quick --budget 10m
  loadkit tune scenarios/tune.yaml --resume reports/20261207T101500Z-tune""",
    "init": """examples:
  loadkit init -m resnet -u 127.0.0.1:8001 --concurrency-range 1:16:2   # writes resnet.yaml
  loadkit init -m bert -u 127.0.0.1:8001 --input-data data.json -o bert.yaml""",
    "validate": """examples:
  loadkit validate scenarios/quickstart.yaml --offline
  loadkit validate my.yaml --target 127.0.0.1:8001""",
    "trace": """examples:
  loadkit serve --trace-file /traces/trace.json       # Triton with a trace file (or yours)
  loadkit trace -u 127.0.0.1:8001 --duration 10m --rate 10 --models resnet
  (it prints the parts written; then load: {replay: [trace.json.0, ...], sample_rate: 10})""",
    "compare": """examples:
  loadkit compare reports/before reports/after --out reports/compare""",
}


