"""`loadkit tune`'s report: the ranked configs with the server's reasons, the winner's
config.pbtxt files, and what it bought over the baseline."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from loadkit.modelconfig import to_pbtxt
from loadkit.plan import load_label
from loadkit.report.units import ms
from loadkit.slo import fmt_value
from loadkit.stats import text as change_text

HEADER = ("rank", "trial", "config", "objective", "constraints", "at load", "infer/s",
          "p50 ms", "p99 ms", "server: avg batch / queue / compute")


def _config(trial: dict[str, Any]) -> str:
    """The trial's values by the last part of each field path (the whole path where two
    dimensions would read the same)."""
    if trial.get("baseline"):
        return "baseline (as the server had it)"
    short = [k.rsplit(".", 1)[1] for k in trial["values"]]
    names = short if len(set(short)) == len(short) else [k.split(".", 1)[1]
                                                         for k in trial["values"]]
    return ", ".join(f"{n}={'off' if v is None else 'on' if v == {} else v}"
                     for n, v in zip(names, trial["values"].values(), strict=True))


def _objective(tune: dict[str, Any], point: dict[str, Any]) -> str:
    """The objective with its interval's half-width and, for a raced trial, how many
    measurements it stands for."""
    v = point.get("objective")
    if v is None:
        return "-"
    text = tune["objective"]
    metric = text.split(" ", 1)[1]
    ci = point.get("objective_ci")
    pm = f" ±{(ci[1] - ci[0]) / 2 / v * 100:.0f}%" if ci and v else ""
    n = f" (x{point['measurements']})" if point.get("measurements") else ""
    if text.startswith("weighted"):
        return f"{v:.3f}x"
    if metric == "throughput":
        return f"{v:.1f} infer/s{pm}{n}"
    if metric in ("goodput", "output_tokens_per_s"):
        return f"{v:.1f}/s{pm}{n}"
    return f"{v / 1000:.3f} ms{pm}{n}"


def _server(point: dict[str, Any]) -> str:
    return "; ".join(
        f"{m}: {s['avg_batch']:.2f} / {s['queue_us']:.0f} us / {s['compute_infer_us']:.0f} us"
        for m, s in point.get("server", {}).items() if s.get("avg_batch") is not None)


def rows(tune: dict[str, Any]) -> list[list[str]]:
    """One row per trial, best first; refused and unmeasured trials last, with why."""
    by_n = {t["trial"]: t for t in tune["trials"]}
    order = tune["ranking"] + [t["trial"] for t in tune["trials"]
                               if t["trial"] not in tune["ranking"]]
    out = []
    for rank, n in enumerate(order, 1):
        t = by_n[n]
        p = t.get("point")
        mark = " **best**" if n == tune.get("best") else ""
        if p is None:
            why = " ".join((t.get("reason") or t["status"]).split())  # one table row
            out.append(["-", f"{n}{mark}", _config(t), "-", f"{t['status']}: {why}", "-", "-",
                        "-", "-", "-"])
            continue
        kept = "met" if p["constraints_met"] else "broken: " + ", ".join(p["broken"])
        if p.get("skipped"):
            kept += f" ({p['skipped']})"
        out.append([str(rank), f"{n}{mark}", _config(t), _objective(tune, p), kept,
                    load_label(p["load"]), f"{p['throughput']:.1f}",
                    ms(p["p50_us"]) if p.get("p50_us") is not None else "-",
                    ms(p["p99_us"]) if p.get("p99_us") is not None else "-", _server(p)])
    return out


def headline(tune: dict[str, Any]) -> list[str]:
    """The search in a few lines: what was searched, how it ended, the winner and its gain."""
    limits = ", ".join(f"{c['metric']} <= {fmt_value(c['metric'], c['limit'])}"
                       if c["metric"] != "min_throughput" else
                       f"throughput >= {c['limit']:g}" for c in tune["constraints"]) or "none"
    measured = sum(1 for t in tune["trials"] if not t.get("baseline"))
    lines = [
        f"Strategy {tune['strategy']}, objective {tune['objective']}, constraints {limits}; "
        f"{measured} of {tune['grid_size']} configs tried besides the baseline in "
        f"{tune['elapsed_s']:g} s" + (f" (stopped: {tune['stopped']})" if tune["stopped"]
                                      else "") + ".",
    ]
    best = next((t for t in tune["trials"] if t["trial"] == tune.get("best")), None)
    if best is None:
        tried = [t for t in tune["trials"] if not t.get("baseline") and t.get("point")]
        lines.append("No config kept the constraints." if tried else
                     "No config was measured besides the baseline, so none was chosen.")
        return lines
    gain = tune.get("gain", {})
    bought = []
    if "throughput_change" in gain:  # with its interval (docs/verdicts.md)
        bought.append(f"throughput {change_text(gain['throughput_change'])} against the "
                      "baseline")
    elif "throughput_x" in gain:
        bought.append(f"{gain['throughput_x']:.2f}x the baseline's throughput (no interval)")
    if "p99_change" in gain:
        bought.append(f"p99 {change_text(gain['p99_change'])}")
    elif "p99_x" in gain:
        bought.append(f"{gain['p99_x']:.2f}x its p99 (no interval)")
    lines.append(f"Best: trial {best['trial']} ({_config(best)})"
                 + (f": {' at '.join(bought[:1])}{', ' + bought[1] if len(bought) > 1 else ''}"
                    if bought else "") + "; config in best/<model>/config.pbtxt.")
    if tune.get("raced"):
        lines.append(f"Raced before naming it: trials {', '.join(map(str, tune['raced']))} "
                     "measured again, interleaved, each standing for all its measurements"
                     + (f" ({tune['race_note']})" if tune.get("race_note") else "") + ".")
    if "ties" in tune:
        words = tune.get("tie_words") or {str(t): "inconclusive" for t in tune["ties"]}
        said = []
        for w, what in (("same", "the same as it within ±noise"),
                        ("inconclusive", "not told apart from it (inconclusive)")):
            found = [k for k, v in words.items() if v == w]
            if found:
                said.append(f"{what}: trial(s) {', '.join(found)}")
        rec = tune.get("recommended") or {}
        lines.append(("; ".join(said) + ". " if said else
                      "Every other config is worse than it beyond noise, or unknown. ")
                     + (f"Recommended: trial {rec['trial']}, {rec['why']}." if rec else ""))
    return lines


def markdown(tune: dict[str, Any]) -> str:
    out = ["", "## Tune", ""] + headline(tune) + [""]
    out.append("| " + " | ".join(HEADER) + " |")
    out.append("|" + "|".join("---" if i in (1, 2, 4, 9) else "---:"
                              for i in range(len(HEADER))) + "|")
    out += ["| " + " | ".join(r) + " |" for r in rows(tune)]
    if tune.get("pareto"):
        out += ["", "On the throughput-vs-p99 front: trials "
                + ", ".join(map(str, tune["pareto"])) + "."]
    return "\n".join(out) + "\n"


def html(tune: dict[str, Any]) -> list[str]:
    out = ["<h2>Tune</h2>"] + [f"<p>{escape(line)}</p>" for line in headline(tune)]
    out.append("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in HEADER) + "</tr>")
    for r in rows(tune):
        out.append("<tr>" + "".join(f"<td class=l>{escape(c)}</td>" if i in (1, 2, 4, 9)
                                    else f"<td>{escape(c)}</td>" for i, c in enumerate(r))
                   + "</tr>")
    out.append("</table>")
    return out


def best_configs(results: dict[str, Any]) -> dict[str, str]:
    """{model: config.pbtxt text} of the winning trial's tuned models, as the server ran them."""
    tune = results.get("tune") or {}
    best = next((t for t in tune.get("trials", []) if t["trial"] == tune.get("best")), None)
    if best is None:
        return {}
    phase = next((p for p in results["phases"] if p["name"] == best["phase"]), None)
    if phase is None:
        return {}
    models = {d["model"] for d in tune["dimensions"]}
    return {m: to_pbtxt(c) for m, c in phase.get("config", {}).items() if m in models}


def write_best(out_dir: Path, results: dict[str, Any], write: Any) -> None:
    for model, text in best_configs(results).items():
        folder = out_dir / "best" / model
        folder.mkdir(parents=True, exist_ok=True)
        write(folder / "config.pbtxt", text)
