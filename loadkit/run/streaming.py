"""A step's streaming numbers (decoupled models, LLMs): time to the first response, gaps
between responses, responses per request, tokens per second and goodput, per template and
for the step, from the window's HDR histograms (µs) and counters.

Tokens: one streamed response is one output token (what an LLM server streams by default);
results.json says so in `tokens_counted_as`.
"""

from __future__ import annotations

from typing import Any

from hdrh.histogram import HdrHistogram

from loadkit.record import StepWindow, latency_summary, new_histogram


def _summary(first: HdrHistogram, inter: HdrHistogram, responses: int, requests: int,
             good: int, duration_s: float, goodput: bool) -> dict[str, Any]:
    per_s = (lambda n: round(n / duration_s, 2)) if duration_s > 0 else (lambda n: 0.0)
    gap_mean = inter.get_mean_value() if inter.get_total_count() else 0.0
    out: dict[str, Any] = {
        "first_response_us": latency_summary(first),
        "inter_response_us": latency_summary(inter),
        "responses": responses,
        "responses_per_request": round(responses / requests, 3) if requests else 0.0,
        "tokens_counted_as": "responses",
        "output_tokens": responses,
        "output_tokens_per_s": per_s(responses),
        # one request's own rate while it streams: 1 / its mean gap
        "output_tokens_per_s_per_request": round(1e6 / gap_mean, 2) if gap_mean else 0.0,
    }
    if goodput:
        out["goodput"] = {"requests": good, "per_s": per_s(good),
                          "ratio": round(good / requests, 5) if requests else 0.0}
    return out


def streaming_results(window: StepWindow, duration_s: float, goodput: bool,
                      input_tokens: dict[str, tuple[float, str]]
                      ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Per decoupled template, and merged over them for the step ({} when none streamed).
    `input_tokens`: an llm template's mean input tokens per request and what counted them."""
    per: dict[str, dict[str, Any]] = {}
    first_all, inter_all = new_histogram(), new_histogram()
    requests_all = 0
    for name, first in window.first_response.items():
        inter = window.inter_response[name]
        requests = window.successes(name)
        per[name] = _summary(first, inter, window.responses[name], requests,
                             window.good[name], duration_s, goodput)
        if window.no_response.get(name):
            per[name]["no_response"] = window.no_response[name]
        if name in window.output_tokens:  # the llm template's tokenizer counted them
            tokens = window.output_tokens[name]
            per[name].update(output_tokens=tokens, tokens_counted_as=input_tokens[name][1],
                             output_tokens_per_s=round(tokens / duration_s, 2)
                             if duration_s > 0 else 0.0)
        if name in input_tokens:
            mean, counted_by = input_tokens[name]
            per[name].update(input_tokens_per_request=round(mean, 2),
                             input_tokens_per_s=round(requests * mean / duration_s, 2)
                             if duration_s > 0 else 0.0, input_tokens_counted_as=counted_by)
        first_all.add(first)
        inter_all.add(inter)
        requests_all += requests
    if not per:
        return per, {}
    merged = _summary(first_all, inter_all, sum(window.responses.values()), requests_all,
                      sum(window.good.values()), duration_s, goodput)
    if window.cancelled:
        merged["cancelled"] = sum(window.cancelled.values())
    if window.no_response:
        merged["no_response"] = sum(window.no_response.values())
    if window.output_tokens:  # some were counted by a tokenizer: the merged count uses theirs
        tokens = sum(p["output_tokens"] for p in per.values())
        merged.update(output_tokens=tokens, tokens_counted_as="per template",
                      output_tokens_per_s=round(tokens / duration_s, 2) if duration_s > 0 else 0.0)
    if any("input_tokens_per_s" in p for p in per.values()):
        merged["input_tokens_per_s"] = round(sum(p.get("input_tokens_per_s", 0.0)
                                                 for p in per.values()), 2)
    return per, merged
