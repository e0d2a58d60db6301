"""Streaming steps (decoupled models, LLMs) in the reports: time to the first response, gaps
between responses, responses per request, tokens/s and goodput, one row per step. The same
rows feed summary.md (markdown) and report.html."""

from __future__ import annotations

from html import escape
from typing import Any

from loadkit.plan import load_label
from loadkit.report.units import ms

HEADER = ("load", "requests/s", "first resp. p50", "first resp. p99", "gap p50", "gap p99",
          "responses/request", "tokens/s", "tokens/s per request", "input tokens/s",
          "goodput/s", "cancelled (Triton)")
NOTE = ("Streaming (decoupled model): a request ends at its final response; latencies above "
        "run to it. First response = time to first token, gap = time between consecutive "
        "responses (inter-token latency), in ms; one streamed response counts as one output "
        "token unless an llm template's tokenizer counted the streamed text (input tokens: "
        "words, or its tokenizer). "
        "Goodput: requests that met every `goodput` limit, per second (share).")


def _cancelled(step: dict[str, Any]) -> str:
    """Requests the scenario cancelled, and beside them Triton's own count of cancelled
    requests (its request_failure metric with reason CANCELED), where the metrics were read."""
    n = step["streaming"].get("cancelled", 0)
    if not n:
        return "-"
    models = step.get("metrics", {}).get("models", {})
    seen = sum(int(m.get("request_failure:CANCELED", 0)) for m in models.values())
    return f"{n} ({seen})" if models else str(n)


def rows(steps: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    out = []
    for s in steps:
        st = s.get("streaming")
        if not st:
            continue
        first, gap = st["first_response_us"], st["inter_response_us"]
        good = st.get("goodput")
        out.append((
            load_label(s["load"]), f"{s['requests_per_s']:.1f}", ms(first["p50"]),
            ms(first["p99"]), ms(gap["p50"]), ms(gap["p99"]), f"{st['responses_per_request']:g}",
            f"{st['output_tokens_per_s']:.1f}", f"{st['output_tokens_per_s_per_request']:.1f}",
            f"{st['input_tokens_per_s']:.1f}" if "input_tokens_per_s" in st else "-",
            f"{good['per_s']:.1f} ({good['ratio']:.0%})" if good else "-", _cancelled(s),
        ))
    return out


def no_response_note(steps: list[dict[str, Any]]) -> str:
    """Streamed requests that ended with no response before their final flag: counted apart,
    never timed as a first response (their latency is in the step's)."""
    parts = [f"{load_label(s['load'])}: {s['streaming']['no_response']}" for s in steps
             if s.get("streaming", {}).get("no_response")]
    if not parts:
        return ""
    return ("Requests whose stream ended with no response (only the final flag; counted in "
            "the latencies, not in first response or gaps): " + ", ".join(parts) + ".")


def markdown(steps: list[dict[str, Any]]) -> list[str]:
    found = rows(steps)
    if not found:
        return []
    note = no_response_note(steps)
    return [NOTE, "", "| " + " | ".join(HEADER) + " |", "|" + "---:|" * len(HEADER),
            *("| " + " | ".join(r) + " |" for r in found), "", *([note, ""] if note else [])]


def html(steps: list[dict[str, Any]]) -> list[str]:
    found = rows(steps)
    if not found:
        return []
    head = "".join(f"<th>{escape(h)}</th>" for h in HEADER)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>"
                   for r in found)
    note = no_response_note(steps)
    return [f"<p>{escape(NOTE)}</p>", f"<table><tr>{head}</tr>{body}</table>",
            *([f"<p>{escape(note)}</p>"] if note else [])]
