#!/usr/bin/env python3
"""Tables, goal lines and the JSON file of tests/proxy-bench.sh.

usage: report.py CONFIG.json PASSES.jsonl IDLE.jsonl OUT.json
  CONFIG  the run's settings (written by proxy-bench.sh)
  PASSES  one JSON object per wrk pass: backend, conc, round, target, the
          PBRESULT fields of post.lua, and the CPU ticks of the proxy and the
          backend over the pass
  IDLE    one JSON object per target and backend: CPU ticks over IDLE seconds
Prints markdown to stdout and writes every figure to OUT.
"""
import json
import random
import statistics
import sys

cfg_path, passes_path, idle_path, out_path = sys.argv[1:5]
cfg = json.load(open(cfg_path))
passes = [json.loads(line) for line in open(passes_path) if line.strip()]
idle = [json.loads(line) for line in open(idle_path) if line.strip()]
tck = cfg["clk_tck"]
targets = cfg["targets"]  # ordered: direct, nginx, then the shoal targets

# Per-pass derived figures.
for p in passes:
    n = max(p["requests"], 1)
    p["rps"] = p["requests"] / (p["duration_us"] / 1e6)
    p["errors"] = p["status"] + p["connect"] + p["read"] + p["write"] + p["timeout"]
    events = cfg["events"][p["backend"]]
    p["events_per_request"] = events
    cpu = lambda ticks: None if ticks is None else ticks / tck * 1e6 / n
    p["proxy_cpu_us_per_req"] = cpu(p.get("proxy_ticks"))
    p["backend_cpu_us_per_req"] = cpu(p.get("backend_ticks"))
    # shoal only: its threads other than the I/O threads (the mesh, polls)
    p["side_cpu_us_per_req"] = cpu(p.get("side_ticks"))
    for k in ("proxy", "backend"):
        v = p[f"{k}_cpu_us_per_req"]
        p[f"{k}_cpu_us_per_event"] = None if v is None else v / events

by = {(p["backend"], p["conc"], p["round"], p["target"]): p for p in passes}


def median_interval(values, level=0.90, resamples=2000):
    """Bootstrap interval of the median (a fixed seed: one run, one answer).
    Why: rounds of this bench spread by +-15 % on a shared host, so a median
    of a few rounds can sit on either side of a goal; the interval says
    whether the run decides it."""
    if len(values) < 5:
        return None
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values)))
                  for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * resamples)]
    hi = meds[int((1 + level) / 2 * resamples) - 1]
    return [lo, hi]


def stats(values, interval=False):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "interval90": median_interval(values) if interval else None}


def cell(s, fmt="{:.0f}"):
    if s is None:
        return "–"
    if s["n"] == 1 or fmt.format(s["min"]) == fmt.format(s["max"]):
        return fmt.format(s["median"])
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}–{fmt.format(s['max'])})"


def cpu_fmt(v):
    return "{:.1f}" if v is None or v < 100 else "{:.0f}"


summary = []
out_lines = []
rounds = range(1, cfg["rounds"] + 1)
for backend in cfg["backends"]:
    events = cfg["events"][backend]
    for conc in cfg["concs"]:
        rows = []
        for t in targets:
            ps = [by.get((backend, conc, r, t["name"])) for r in rounds]
            ps = [p for p in ps if p]
            if not ps:
                continue
            ng = {r: by.get((backend, conc, r, "nginx")) for r in rounds}
            ratio = [p["rps"] / ng[p["round"]]["rps"] for p in ps if ng.get(p["round"])]
            p50_vs_nginx = [p["p50_us"] - ng[p["round"]]["p50_us"] for p in ps
                            if ng.get(p["round"])]
            cpu_key = "backend" if t["kind"] == "direct" else "proxy"
            row = {
                "backend": backend, "conc": conc, "target": t["name"], "kind": t["kind"],
                "label": t.get("label"), "mesh": t.get("mesh", False),
                "rps": stats([p["rps"] for p in ps]),
                "p50_us": stats([p["p50_us"] for p in ps]),
                "p99_us": stats([p["p99_us"] for p in ps]),
                "cpu_us_per_req": stats([p[f"{cpu_key}_cpu_us_per_req"] for p in ps]),
                "cpu_us_per_event": stats([p[f"{cpu_key}_cpu_us_per_event"] for p in ps]),
                "cpu_of": cpu_key,
                "backend_cpu_us_per_req": stats([p["backend_cpu_us_per_req"] for p in ps]),
                "rps_vs_nginx": stats(ratio),
                "p50_minus_nginx_us": stats(p50_vs_nginx),
                "errors": sum(p["errors"] for p in ps),
                "requests": sum(p["requests"] for p in ps),
            }
            rows.append(row)
        summary.extend(rows)
        if not rows:
            continue
        unit = "µs/event" if events > 1 else "µs/req"
        what = cfg["backend_desc"][backend]
        out_lines.append(f"\n### {backend} backend, c={conc} ({what})\n")
        out_lines.append(f"| target | req/s | p50 µs | p99 µs | CPU {unit} | req/s vs nginx | errors |")
        out_lines.append("|---|---|---|---|---|---|---|")
        for r in rows:
            c = r["cpu_us_per_event"] if events > 1 else r["cpu_us_per_req"]
            ccell = cell(c, cpu_fmt(c and c["median"]))
            if r["kind"] == "direct":
                ccell = "backend " + ccell
            ratio = cell(r["rps_vs_nginx"], "{:.2f}")
            out_lines.append(
                f"| {r['target']} | {cell(r['rps'])} | {cell(r['p50_us'])} | {cell(r['p99_us'])} "
                f"| {ccell} | {ratio} | {r['errors']} |")

idle_rows = []
for i in idle:
    secs = i["secs"]
    idle_rows.append({**i, "cpu_ms_per_s": i["ticks"] / tck * 1e3 / secs})
if idle_rows:
    out_lines.append("\nIdle CPU before load, ms per second (background work: health checks, "
                     "load polls, mesh sync):")
    for backend in cfg["backends"]:
        parts = [f"{i['target']} {i['cpu_ms_per_s']:.1f}" for i in idle_rows
                 if i["backend"] == backend]
        if parts:
            out_lines.append(f"- {backend}: " + ", ".join(parts))

# Goals: ratios to nginx measured in the same rounds (a host twice as fast
# moves both), fixed backend at c=8; the stream goal from the stream backend.
goals = []
goal_lines = []
gconc = 8


def per_round(backend, conc, name, other, key):
    """Median and range of name's `key` over other's, round by round."""
    out = []
    for r in rounds:
        a = by.get((backend, conc, r, name))
        b = by.get((backend, conc, r, other))
        if a and b and a.get(key) is not None and b.get(key):
            out.append(a[key] / b[key])
    return stats(out, interval=True)


def ratio_detail(s):
    ci = s.get("interval90")
    within = f", 90 % interval of the median {ci[0]:.2f}–{ci[1]:.2f}" if ci else ""
    return f"median {s['median']:.2f} x, rounds {s['min']:.2f}–{s['max']:.2f}{within}"


def verdict(s, goal, at_most):
    """met / NOT met by the median, and whether the interval decides it."""
    ok = s["median"] <= goal if at_most else s["median"] >= goal
    ci = s.get("interval90")
    if ci is None:
        return ok, ""
    inside = ci[1] <= goal if at_most else ci[0] >= goal
    outside = ci[0] > goal if at_most else ci[1] < goal
    return ok, "" if inside or outside else " (the interval spans the goal: undecided)"


rowmap = {(r["backend"], r["conc"], r["target"]): r for r in summary}
ng = rowmap.get(("fixed", gconc, "nginx"))
if ng is None:
    goal_lines.append("goals: skipped (they need the fixed backend at c=8 with nginx)")
else:
    for t in targets:
        if t["kind"] != "shoal":
            continue
        r = rowmap.get(("fixed", gconc, t["name"]))
        if r is None:
            continue
        name = t["name"]
        cpu = per_round("fixed", gconc, name, "nginx", "proxy_cpu_us_per_req")
        rps = per_round("fixed", gconc, name, "nginx", "rps")
        checks = []
        if cpu:
            checks.append((
                "CPU per request <= 1.10 x nginx's", verdict(cpu, 1.10, True),
                f"{r['cpu_us_per_req']['median']:.1f} vs {ng['cpu_us_per_req']['median']:.1f} µs; "
                + ratio_detail(cpu)))
        if rps:
            checks.append((
                "req/s >= 0.95 x nginx's", verdict(rps, 0.95, False),
                f"{r['rps']['median']:.0f} vs {ng['rps']['median']:.0f} req/s; " + ratio_detail(rps)))
        stream = per_round("stream", gconc, name, "nginx", "proxy_cpu_us_per_event")
        if stream:
            checks.append((
                "stream CPU per SSE event <= 1.10 x nginx's", verdict(stream, 1.10, True),
                ratio_detail(stream)))
        for goal, (ok, undecided), detail in checks:
            goals.append({"target": name, "goal": goal, "met": ok, "detail": detail + undecided})
    for t in targets:
        if t["kind"] != "shoal" or not t.get("mesh") or not cfg["mesh"] == "both":
            continue
        x = per_round("fixed", gconc, t["name"], t["label"], "proxy_cpu_us_per_req")
        on = rowmap.get(("fixed", gconc, t["name"]))
        off = rowmap.get(("fixed", gconc, t["label"]))
        if not x or not on or not off:
            continue
        ok, undecided = verdict(x, 1.05, True)
        side_on = stats([by[k]["side_cpu_us_per_req"] for k in by
                         if k[0] == "fixed" and k[1] == gconc and k[3] == t["name"]])
        side_off = stats([by[k]["side_cpu_us_per_req"] for k in by
                          if k[0] == "fixed" and k[1] == gconc and k[3] == t["label"]])
        side = ""
        if side_on and side_off:
            side = (f"; threads other than the I/O threads {side_on['median']:.2f} vs "
                    f"{side_off['median']:.2f} µs/req")
        goals.append({"target": t["label"], "goal": "mesh-on CPU/req <= 1.05 x mesh-off",
                      "met": ok,
                      "detail": f"{on['cpu_us_per_req']['median']:.1f} vs "
                                f"{off['cpu_us_per_req']['median']:.1f} µs; " + ratio_detail(x)
                                + side + undecided})
    goal_lines.append(f"\nGoals (ratios per round to the same round's nginx, c={gconc}, "
                      f"medians over {cfg['rounds']} round(s)):")
    for g in goals:
        goal_lines.append(f"- {g['target']}: {g['goal']}: {'met' if g['met'] else 'NOT met'} "
                          f"({g['detail']})")

print("\n".join(out_lines + goal_lines))
json.dump({"config": cfg, "summary": summary, "goals": goals, "idle": idle_rows,
           "passes": passes}, open(out_path, "w"), indent=1)
