"""Accounting and the run's verdict: the run itself checks that every request is accounted for.

Per step, three invariants (docs/reliability.md):
- sent == successes + errors (what left this generator came back, one way or the other);
- open loop: scheduled == sent + dropped;
- per model, client successes == the server's success delta, when the server's statistics were
  read before and after the (drained) window; a model an ensemble runs is expected once per
  step that names it, for each of the ensemble's requests, beside its direct requests (a
  model a BLS model calls is `unchecked`: no config says how often). Some failures may still
  count as successes on the server (SERVER_MAY_COUNT): a server count above the client's by
  at most that many is explained, and said so; anything else is a mismatch.

A broken invariant makes the step `accounting: mismatch` and the run `failed` (exit 1): a
number loadkit knows is wrong is never reported as a complete run. A statistics read that failed
is not a zero: the check is skipped with the reason.
"""

from __future__ import annotations

from typing import Any

from loadkit.record import OTHER_MESSAGES, StepWindow

# Failures whose request the server may count as a success all the same: abandoned by the
# client (a deadline, a cancel), answered with a reply the client refused (too large,
# compressed), or answered by the model with an error response (a stream's INFER_ERROR, unary
# INTERNAL): Triton 2.51 counts a request its python model answered with an error as a success;
# and MISMATCH, a good answer by the server that loadkit's output validation judged wrong.
SERVER_MAY_COUNT = ("DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED", "INTERNAL",
                    "INFER_ERROR", "MISMATCH")


ANY = "*"  # in template_calls: the template's python model may call models it did not declare


def template_calls(models: dict[str, str], composing: dict[str, tuple[str, ...]],
                   known: dict[str, bool], scripted: dict[str, bool] | None = None,
                   ) -> dict[str, dict[str, int | None]]:
    """Per template, the requests one of its requests makes to each model on the server: 1 to
    its own model, one per step to each model of an ensemble (its config lists them), and
    None (not known) to the models a BLS model calls from its code: those it declares
    (`composing_models`), and ANY for a python model's undeclared calls."""
    out: dict[str, dict[str, int | None]] = {}
    for template, model in models.items():
        calls: dict[str, int | None] = {model: 1}
        if scripted and scripted.get(template):
            calls[ANY] = None
        for inner in composing.get(template, ()):
            if known.get(template):
                calls[inner] = (calls.get(inner) or 0) + 1
            else:
                calls[inner] = None
        out[template] = calls
    return out


def check_step(
    window: StepWindow,
    calls: dict[str, dict[str, int | None]],
    server: dict[str, dict[str, Any]],
    unavailable: dict[str, str],
    open_loop: bool,
    shared: bool = False,
) -> dict[str, Any]:
    """The step's `accounting` section: status ok | mismatch | unchecked, each check with its
    numbers, and what could not be checked and why. `calls`: template_calls()."""
    checks = _totals(window, open_loop)
    skipped: list[str] = []
    for model, reaching in _reaching(calls).items():
        if model == ANY:
            continue
        why = ("the target is shared (target.shared: other clients' requests count there too)"
               if shared else unavailable.get(model) or (
                   "no server statistics" if model not in server else ""))
        bls = [t for t, k in reaching.items() if k is None]
        if not why and bls:
            why = (f"it is called from the code of a BLS model (template '{bls[0]}'), so how "
                   "many calls a request makes is not in any config")
        if why:
            skipped.append(f"{model}: client == server not checked: {why}")
            continue
        checks.append(_model_check(window, calls, model, reaching,
                                   int(server[model]["success"])))
    broken = [c for c in checks if not c["ok"]]
    status = "mismatch" if broken else ("unchecked" if skipped else "ok")
    out: dict[str, Any] = {"status": status, "checks": checks}
    if skipped:
        out["unchecked"] = skipped
    if broken:
        out["reason"] = "; ".join(f"{c['check']}: {c['left']} != {c['right']}"
                                  + (f" ({c['hint']})" if "hint" in c else "") for c in broken)
    return out


def _totals(window: StepWindow, open_loop: bool) -> list[dict[str, Any]]:
    """The client's own totals: what was sent came back, the schedule, the timeline."""
    successes, errors = window.successes(), window.error_count()
    cancelled = sum(window.cancelled.values())
    checks = [
        _check("sent == successes + errors + cancelled", window.sent,
               successes + errors + cancelled) if cancelled else
        _check("sent == successes + errors", window.sent, successes + errors),
    ]
    if open_loop:
        checks.append(_check("scheduled == sent + dropped", window.scheduled,
                             window.sent + sum(window.dropped.values())))
    window.settle()  # the timeline's seconds add up to the step (record.Second)
    seconds = window.seconds.values()
    checks.append(_check("timeline successes == successes",
                         sum(sum(s.ok.values()) for s in seconds), successes))
    checks.append(_check("timeline errors == errors",
                         sum(sum(s.errors.values()) for s in seconds), errors))
    if window.seconds:
        checks.append(_check("timeline sent == sent", sum(s.sent for s in seconds),
                             window.sent))
    return checks


def _model_check(window: StepWindow, calls: dict[str, dict[str, int | None]], model: str,
                 reaching: dict[str, int | None], served: int) -> dict[str, Any]:
    """The client's successes that reached `model` (directly and through ensembles) against
    the server's success delta; an excess the failures explain is noted, not a mismatch."""
    parts = {t: window.successes(t) * int(k or 0) for t, k in reaching.items()}
    client = sum(parts.values())
    name = f"{model}: client successes == server success delta"
    direct = [t for t in parts if next(iter(calls[t])) == model]  # its own model first
    if len(parts) > len(direct):  # some reach it through an ensemble: show the sum
        name += " (" + " + ".join(f"{n} from {t}" for t, n in parts.items()) + ")"
    check = _check(name, client, served)
    if check["ok"]:
        return check
    may = sum(window.errors.get(t, {}).get(c, 0) for t in reaching
              for c in SERVER_MAY_COUNT) + sum(window.cancelled[t] for t in reaching)
    if client < served <= client + may:
        check["ok"] = True
        check["note"] = (f"{served - client} request(s) that failed here count as successes on "
                         "the server (abandoned at a deadline or cancel, a reply refused, or "
                         "the model's own error response)")
        return check
    bls = [t for t, per in calls.items() if ANY in per and t not in reaching]
    if served > client and bls:
        check["hint"] = (f"template '{bls[0]}' runs a python model, which may call {model} "
                         f"from its code (BLS): if it does, declare composing_models: [{model}] "
                         "on it, and this check is skipped")
    return check


def _reaching(calls: dict[str, dict[str, int | None]]) -> dict[str, dict[str, int | None]]:
    """Per model on the server, the templates whose requests reach it and how many times."""
    out: dict[str, dict[str, int | None]] = {}
    for template, per in calls.items():
        for model, k in per.items():
            out.setdefault(model, {})[template] = k
    return out


def _check(name: str, left: int, right: int) -> dict[str, Any]:
    return {"check": name, "left": int(left), "right": int(right), "ok": left == right}


def first_message(messages: dict[str, list[dict[str, Any]]]) -> str:
    """The most frequent kept error message of a step or run, as 'CODE: message'. A real
    message goes before the "(other messages)" bucket, which is larger whenever every failure
    says something different (a correlation id, a request id in the text)."""
    best = ("", "", 0, False)
    for code, kept in messages.items():
        for m in kept:
            real = m["message"] != OTHER_MESSAGES
            if (real, m["count"]) > (best[3], best[2]):
                best = (code, m["message"], m["count"], real)
    return f"{best[0]}: {best[1]}" if best[0] else ""


def run_failures(results: dict[str, Any]) -> list[str]:
    """Why a run whose phases all ran must still be reported `failed` (empty: it need not).

    Measured numbers that do not add up, a run that measured nothing, a request template that
    never once succeeded, and a model left on a config other than the one it started with."""
    reasons: list[str] = []
    steps = [s for p in results["phases"] for s in p["steps"]]
    for s in steps:
        acc = s.get("accounting", {})
        if acc.get("status") == "mismatch":
            reasons.append(f"step {s['phase']}/{s['index']}: accounting mismatch: "
                           f"{acc.get('reason', '')}")
    if steps and not any(s["requests"] for s in steps):
        why = first_message(_all_messages(steps))
        reasons.append("nothing was measured: every step had 0 successful requests"
                       + (f" ({why})" if why else ""))
    else:
        ok: dict[str, int] = {}
        failed: dict[str, int] = {}
        for s in steps:
            for name, c in s["client"].items():
                ok[name] = ok.get(name, 0) + c["requests"]
                failed[name] = failed.get(name, 0) + c["errors"]
        for name, n in failed.items():
            if n and not ok.get(name):
                codes = {code for s in steps
                         for code in s["client"].get(name, {}).get("errors_by_code", {})}
                messages = _all_messages(
                    [s for s in steps if s["client"].get(name, {}).get("errors")])
                # the template's own codes' messages (a step's messages are kept per code)
                why = first_message({c: m for c, m in messages.items() if c in codes}
                                    if codes else messages)
                reasons.append(f"request template '{name}': all {n} requests failed, none "
                               f"measured" + (f" ({why})" if why else ""))
    for s in steps:
        st = s.get("stability") or {}
        if st and not st.get("stable") and not st.get("allow_unstable"):
            reasons.append(f"step {s['phase']}/{s['index']}: {st.get('reason', 'not stable')} "
                           "(until_stable: {allow_unstable: true} accepts it)")
    for p in results["phases"]:
        if p["status"] == "failed":
            reasons.append(f"phase '{p['name']}' failed: {p['reason']}")
    for e in results.get("events", []):
        if e["event"] == "restore_failed":
            reasons.append(f"model '{e.get('model', '?')}' was not restored: {e['detail']}")
    return reasons


def _all_messages(steps: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    merged: dict[str, dict[str, int]] = {}
    for s in steps:
        for code, kept in s.get("error_messages", {}).items():
            into = merged.setdefault(code, {})
            for m in kept:
                into[m["message"]] = into.get(m["message"], 0) + m["count"]
    return {c: [{"message": t, "count": n} for t, n in kept.items()]
            for c, kept in merged.items()}
