"""Turn bench/run_all.py's results.json into results.md (medians, ratios, the machine and
versions) and results.png (matplotlib; skipped with a note when matplotlib is missing).

    python bench/report.py bench/results.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

OURS = "ours"
PEERS = ["pgqueuer", "procrastinate", "dbos", "django-tasks-db"]
ENGINES = [OURS, *PEERS]
PGQ_DEFAULTS = "pgqueuer (defaults)"
TIMES, DASH = "\u00d7", "\u2013"  # the multiplication sign and the en dash

# (row label, bench, key in the result line(s), higher is better)
METRICS: list[tuple[str, str, tuple[str, ...], bool]] = [
    ("enqueue, jobs/s (one transaction each)", "enqueue", ("per_s",), True),
    ("drain, jobs/s: 1 process, concurrency 8", "drain1", ("runs_per_s", "per_s"), True),
    ("drain, jobs/s: 2 processes, concurrency 8", "drain2", ("runs_per_s", "per_s"), True),
    ("enqueue → start latency p50, ms (idle worker)", "latency", ("p50_ms",), False),
    ("enqueue → start latency p99, ms (idle worker)", "latency", ("p99_ms",), False),
    ("10-step workflows, steps/s", "steps", ("steps_per_s",), True),
    ("one 10-step workflow, ms (enqueue → finished)", "steps", ("single_run_ms_median",), False),
    ("worker peak RSS, MiB (concurrency 16, draining)", "rss", ("rss_mib",), False),
]


def values(results: list[dict[str, Any]], engine: str, bench: str, keys: tuple[str, ...]):
    out = []
    for r in results:
        if r["engine"] == engine and r["bench"] == bench and "error" not in r:
            out += [r[k] for k in keys if k in r][:1]
    return out


def errors(results: list[dict[str, Any]], engine: str, bench: str) -> list[str]:
    return [
        r["error"]
        for r in results
        if r["engine"] == engine and r["bench"] == bench and "error" in r
    ]


def med(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


def fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def cell(vals: list[float]) -> str:
    if not vals:
        return "n/a"
    text = fmt(med(vals))
    if len(vals) > 1 and min(vals) != max(vals):
        text += f" <sub>{fmt(min(vals))}{DASH}{fmt(max(vals))}</sub>"
    return text


def ratio(ours: float | None, peer: float | None, higher_better: bool) -> str:
    if not ours or not peer:
        return "n/a"
    r = ours / peer if higher_better else peer / ours
    return f"{r:.2f}{TIMES}"


def table(raw: dict[str, Any]) -> list[str]:
    res = raw["results"]
    na = raw.get("na", {})
    lines = [
        "| metric | " + " | ".join(ENGINES) + " |",
        "|---|" + "---:|" * len(ENGINES),
    ]
    for label, bench, keys, _ in METRICS:
        row = []
        for e in ENGINES:
            if e in na:
                row.append("n/a¹")
            elif bench == "steps" and e not in (OURS, "dbos"):
                row.append("—")
            else:
                row.append(cell(values(res, e, bench, keys)))
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    lines += [
        "",
        f"Ours relative to each peer (median ÷ median; **above 1{TIMES} means ours is better**:"
        " faster, or lower latency / memory):",
        "",
        "| metric | " + " | ".join(PEERS) + " |",
        "|---|" + "---:|" * len(PEERS),
    ]
    for label, bench, keys, higher in METRICS:
        ours = med(values(res, OURS, bench, keys))
        row = [
            "—"
            if bench == "steps" and p != "dbos"
            else ratio(ours, med(values(res, p, bench, keys)), higher)
            for p in PEERS
        ]
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    return lines


def extras(raw: dict[str, Any]) -> list[str]:
    res = raw["results"]
    out = []
    pgq = values(res, PGQ_DEFAULTS, "drain1", ("per_s",))
    if pgq:
        out.append(
            f"- **PgQueuer on its own defaults** (dequeue batch 10, no in-flight cap), 1 process:"
            f" {cell(pgq)} jobs/s (the table caps it at 8 in flight, like everyone else)."
        )
    tps = values(res, "pgbench", "pgbench", ("tps",))
    if tps:
        out.append(
            f"- **Physical limit** (pgbench, 8 clients, one INSERT + one `FOR UPDATE SKIP LOCKED`"
            f" claim per transaction): {cell(tps)} transactions/s."
        )
    for r in res:
        if r["bench"] == "scale" and "error" not in r:
            out.append(
                f"- **Scale** (ours, in-process claim + complete, one at a time):"
                f" {fmt(r['claims_per_s_empty'])} claims/s on an empty table,"
                f" {fmt(r['claims_per_s_loaded'])} with {r['finished']:,} finished and"
                f" {r['waiting']:,} waiting runs in it ({r['ratio']:.2f}{TIMES} the empty rate)."
            )
    return out


def failures(raw: dict[str, Any]) -> list[str]:
    out = [f"- {what}: {why}" for what, why in raw.get("na", {}).items()]
    seen = set()
    for r in raw["results"]:
        if "error" in r and (r["engine"], r["bench"]) not in seen:
            seen.add((r["engine"], r["bench"]))
            n = len(errors(raw["results"], r["engine"], r["bench"]))
            runs = sum(
                x["engine"] == r["engine"] and x["bench"] == r["bench"] for x in raw["results"]
            )
            out.append(
                f"- {r['engine']} / {r['bench']}: failed {n} of {runs} times"
                f" (median of the others): `{r['error']}`"
            )
    return out


NOTES = """\
How each number is taken (every engine on the same throwaway cluster, databases recreated per
measurement, engines alternated and the order rotated each repetition):

- **enqueue**: one client, {enqueue_jobs:,} jobs, one per transaction (autocommit), jobs/s.
- **drain**: {jobs:,} no-op single-step jobs queued first (batched where the engine can), then the
  workers start; jobs/s from the first job leaving the queue to the last one finished, or, for
  an engine that has not emptied the queue {drain_seconds:g} s after its first job left it, the
  jobs finished in those {drain_seconds:g} s (a steady rate under a backlog of thousands; it
  keeps the slow engines from taking most of the run). Ours is `bench/engine.py drain` (run
  timestamps); the peers' drivers poll their job table every 10 ms.
- **latency**: one idle worker, {latency_jobs:,} jobs enqueued 20 ms apart; ours is
  `created_at → started_at`, a peer's job records `time.time()` minus the enqueue time carried
  in its payload. Every driver, ours included, waits until its worker says it is set up (ours:
  listening for wake-ups), then 1 s.
- **steps**: {workflows:,} ten-step workflows drained by one worker at concurrency 8 (steps/s),
  and the median of 5 single workflows on an idle worker (enqueue → finished).
- **RSS**: peak `VmRSS` of each worker process (and its children), sampled every 50 ms while it
  drains {rss_jobs:,} jobs at concurrency 16 ({rss_reps} repetition(s)).

Per-engine configuration (durable defaults everywhere: fsync and synchronous_commit on, no
unlogged tables):

- **ours**: `manage.py runworker --concurrency N` (LISTEN/NOTIFY on, 5 s fallback poll).
- **pgqueuer**: asyncpg driver, `QueueManager.run(batch_size=N/2, max_concurrent_tasks=N)`:
  PgQueuer wants max_concurrent_tasks at least twice batch_size, so concurrency 8 dequeues 4
  at a time.
- **procrastinate**: `PsycopgConnector`, async task, `run_worker_async(concurrency=N)`.
- **dbos**: queue registered with `worker_concurrency=N` and `polling_interval_sec=0.01` (the
  default 1 s would cap a worker at N workflows per second); a job is a workflow with one step;
  the queue is filled by 8 enqueuing threads (DBOS has no batch enqueue).
- **django-tasks-db**: Django's `django.tasks` with the `DatabaseBackend`, `manage.py db_worker`
  on its defaults; it runs one task at a time (no concurrency setting), so its "concurrency 8"
  and "16" rows are really concurrency 1, and it polls every 1 s when idle.
"""


def markdown(raw: dict[str, Any], chart: bool) -> str:
    m = raw["machine"]
    load = raw["load_before"][0]
    lines = [
        "# Benchmarks: ours vs PgQueuer, Procrastinate, DBOS, django-tasks-db",
        "",
        f"Produced by `make bench` (`bench/run_all.py`) on {raw['when']} in"
        f" {raw['wall_seconds'] // 60} min {raw['wall_seconds'] % 60} s; medians of"
        f" {raw['args']['reps']} repetitions (range in small print), raw numbers in"
        " `bench/results.json`.",
        "",
    ]
    if load > 0.7:
        lines += [
            f"> **Noisy machine.** It was shared with other engineers' test runs (load average"
            f" {load:.2f} on {m['cores']} cores just before the run, {raw['load_after'][0]:.2f}"
            " after). Absolute numbers are low and spread; compare engines within a row.",
            "",
        ]
    lines += [f"> {note}" for note in raw.get("notes", [])] + ([""] if raw.get("notes") else [])
    if chart:
        lines += ["![benchmark chart](results.png)", ""]
    lines += table(raw)
    lines += ["", *extras(raw)]
    lines += ["", "¹ n/a: see *Failures and n/a* below.", ""]
    fails = failures(raw)
    lines += ["## Failures and n/a", "", *(fails or ["- none: every engine ran every time."]), ""]
    keys = ("jobs", "enqueue_jobs", "latency_jobs", "workflows", "rss_jobs")
    sizes: dict[str, float] = {k: int(raw["args"][k]) for k in keys}
    sizes["drain_seconds"] = float(raw["args"].get("drain_seconds", 0)) or float("inf")
    sizes["rss_reps"] = min(int(raw["args"]["rss_reps"]), int(raw["args"]["reps"]))
    lines += ["## Method", "", NOTES.format(**sizes)]
    lines += [
        "## Machine and versions",
        "",
        f"- {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}",
        f"- PostgreSQL {m['postgresql']} (throwaway cluster, "
        + ", ".join(f"{k}={v}" for k, v in m["postgresql_settings"].items())
        + ")",
        f"- Python {m['python']}; ours: {code(m['our_commit'], raw.get('our_code_after'))}",
        *versions(raw["versions"]),
        "",
    ]
    return "\n".join(lines)


def code(before: str, after: str | None) -> str:
    if not after or after == before:
        return f"`{before}`"
    return f"`{before}` at the start, `{after}` at the end (engine commits landed during the run)"


def versions(found: dict[str, str]) -> list[str]:
    groups: dict[str, list[str]] = {}
    for key, version in found.items():
        venv, dist = key.split(": ", 1)
        groups.setdefault(venv, []).append(f"{dist} {version}")
    return [f"- {venv}: " + ", ".join(dists) for venv, dists in groups.items()]


def plot(raw: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    res = raw["results"]
    colors = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8), gridspec_kw={"width_ratios": [3, 1.6, 1]})
    panels = [
        (
            axes[0],
            "throughput (higher is better)",
            "per second, log scale",
            [
                ("enqueue", "enqueue", ("per_s",)),
                ("drain 1 proc", "drain1", ("runs_per_s", "per_s")),
                ("drain 2 procs", "drain2", ("runs_per_s", "per_s")),
                ("steps (10-step wf)", "steps", ("steps_per_s",)),
            ],
        ),
        (
            axes[1],
            "pickup latency, idle worker (lower is better)",
            "ms, log scale",
            [("p50", "latency", ("p50_ms",)), ("p99", "latency", ("p99_ms",))],
        ),
        (axes[2], "worker RSS at concurrency 16", "MiB", [("peak RSS", "rss", ("rss_mib",))]),
    ]
    width = 0.8 / len(ENGINES)
    for ax, title, ylabel, groups in panels:
        for i, e in enumerate(ENGINES):
            xs, ys = [], []
            for g, (_, bench, keys) in enumerate(groups):
                v = med(values(res, e, bench, keys))
                if v:
                    xs.append(g + (i - (len(ENGINES) - 1) / 2) * width)
                    ys.append(v)
            ax.bar(xs, ys, width, label=e, color=colors[i])
        ax.set_xticks(range(len(groups)), [g[0] for g in groups])
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        if "log" in ylabel:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    tps = med(values(res, "pgbench", "pgbench", ("tps",)))
    if tps:
        axes[0].axhline(tps, color="black", linestyle="--", linewidth=1)
        axes[0].annotate(
            f"pgbench INSERT+claim, 8 clients: {tps:,.0f}/s",
            (0.01, tps),
            xycoords=("axes fraction", "data"),
            textcoords="offset points",
            xytext=(0, 3),
            fontsize=8,
        )
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncols=len(ENGINES))
    m = raw["machine"]
    fig.suptitle(
        f"Medians of {raw['args']['reps']} · PostgreSQL {m['postgresql']}, fsync on ·"
        f" {m['cores']} cores · {raw['when']}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "results.json")
    raw = json.loads(src.read_text())
    chart = plot(raw, src.with_name("results.png"))
    if not chart:
        raw.setdefault("na", {})["chart"] = "matplotlib not available: no results.png"
    src.with_name("results.md").write_text(markdown(raw, chart))
    print(f"wrote {src.with_name('results.md')}" + (" and results.png" if chart else ""))


if __name__ == "__main__":
    main()
