"""Turn bench/run_all.py's results.json into results.md (medians, ratios, the machine and
versions) and results.png (matplotlib; skipped with a note when matplotlib is missing).

    python bench/report.py bench/results.json [--readme README.md]

With --readme, the paragraph between README.md's bench:headline markers is rewritten from the
same numbers, so that the README quotes the last run and nothing else.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

OURS = "ours"
BASELINE = "baseline"
PEERS = ["pgqueuer", "procrastinate", "dbos", "django-tasks-db"]
ENGINES = [OURS, *PEERS]
TIMES, DASH = "\u00d7", "\u2013"  # the multiplication sign and the en dash
DRAIN_KEYS = ("runs_per_s", "per_s")
CONCURRENCIES: list[int | None] = [None, 8, 16, 32, 64]
ASYNC_CONCURRENCIES = [16, 64, 256]
PGQUEUER_BATCH = 10  # PgQueuer's default dequeue batch (bench/run_all.py's async rows)


def drain_key(processes: int, concurrency: int | None) -> str:
    """As bench/run_all.py names a drain: "drain p1 c32", "drain p2 cdefault"."""
    return f"drain p{processes} c{concurrency or 'default'}"


def async_drain_key(processes: int, concurrency: int) -> str:
    """As bench/run_all.py names an async drain: "async drain p1 c64"."""
    return f"async drain p{processes} c{concurrency}"


# (row label, bench, keys in the result line(s), higher is better)
Metric = tuple[str, str, tuple[str, ...], bool]
ENQUEUE: Metric = ("enqueue, jobs/s (one transaction each)", "enqueue", ("per_s",), True)
P50: Metric = ("pickup p50, ms (commit → job starts, idle worker)", "latency", ("p50_ms",), False)
P99: Metric = ("pickup p99, ms (commit → job starts, idle worker)", "latency", ("p99_ms",), False)
# Every engine at eight in flight (the second table).
CAPPED: list[Metric] = [
    ENQUEUE,
    ("drain, jobs/s: 1 process, 8 in flight", drain_key(1, 8), DRAIN_KEYS, True),
    ("drain, jobs/s: 2 processes, 8 in flight each", drain_key(2, 8), DRAIN_KEYS, True),
    P50,
    P99,
    ("10-step workflows, steps/s", "steps", ("steps_per_s",), True),
    ("one 10-step workflow, ms (enqueue → finished)", "steps", ("single_run_ms_median",), False),
    ("worker peak RSS, MiB (concurrency 16, draining)", "rss", ("rss_mib",), False),
]
SCALE_KEYS = [
    ("claims/s, empty table", "scale", ("claims_per_s_empty",), True),
    ("claims/s, loaded table (see Scale below)", "scale", ("claims_per_s_loaded",), True),
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


def ratio_value(ours: float | None, other: float | None, higher_better: bool) -> float | None:
    """Above 1: ours is better (faster, or lower latency / memory)."""
    if not ours or not other:
        return None
    return ours / other if higher_better else other / ours


def ratio(ours: float | None, other: float | None, higher_better: bool) -> str:
    r = ratio_value(ours, other, higher_better)
    return "n/a" if r is None else f"{r:.2f}{TIMES}"


def m(res: list[dict[str, Any]], engine: str, metric: Metric) -> float | None:
    return med(values(res, engine, metric[1], metric[2]))


def our_default(res: list[dict[str, Any]]) -> str:
    """runworker's default concurrency, as the measured worker reported it."""
    for r in res:
        if r["engine"] == OURS and r.get("concurrency") is None and "worker_concurrency" in r:
            return str(r["worker_concurrency"])
    return "?"


# -- the headline: ours and PgQueuer, each on its own defaults --------------------------------


def headline_metrics(processes: int, concurrency: int | None) -> Metric:
    return (
        f"drain, jobs/s: {processes} process{'es' if processes > 1 else ''}",
        drain_key(processes, concurrency),
        DRAIN_KEYS,
        True,
    )


def headline(raw: dict[str, Any]) -> list[str]:
    res = raw["results"]
    dflt = our_default(res)
    lines = [
        f"| metric | ours, defaults (concurrency {dflt}) | ours, `--concurrency 32` |"
        f" PgQueuer, defaults (batch 10, no cap) | ours ÷ PgQueuer | ours at 32 ÷ PgQueuer |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for metric in (ENQUEUE, headline_metrics(1, None), headline_metrics(2, None), P50, P99):
        label, bench, keys, higher = metric
        ours = values(res, OURS, bench, keys)
        pgq = values(res, "pgqueuer", bench, keys)
        if bench.startswith("drain"):
            at32 = values(res, OURS, bench.replace("cdefault", "c32"), keys)
            cells = [cell(ours), cell(at32), cell(pgq)]
            ratios = [ratio(med(ours), med(pgq), higher), ratio(med(at32), med(pgq), higher)]
        else:  # one worker-independent measurement (enqueue) or an idle default worker
            cells = [cell(ours), "same" if bench == "enqueue" else "—", cell(pgq)]
            ratios = [ratio(med(ours), med(pgq), higher), "—"]
        lines.append(f"| {label} | " + " | ".join(cells + ratios) + " |")
    return lines


# -- issue 42's table: ours, PgQueuer and Celery on Redis, each on its own defaults ------------

ISSUE_METRICS: list[Metric] = [
    ("enqueue/s", "enqueue", ("per_s",), True),
    ("drain/s 1 proc", drain_key(1, None), DRAIN_KEYS, True),
    ("drain/s 2 proc", drain_key(2, None), DRAIN_KEYS, True),
    ("pickup p50, ms", "latency", ("p50_ms",), False),
    ("pickup p99, ms", "latency", ("p99_ms",), False),
]
ISSUE_ENGINES = [
    ("pgqueuer", "PgQueuer (batch 10, uncapped)"),
    ("celery", "Celery on Redis (acks_late, prefork default)"),
]


def issue_table(raw: dict[str, Any]) -> list[str]:
    """Rows: each engine's medians, then ours ÷ each (above 1: ours is better)."""
    res = raw["results"]
    engines = [*ISSUE_ENGINES, (OURS, f"ours (runworker defaults, {our_default(res)})")]
    if has_baseline(raw):
        ref = (raw.get("baseline") or {}).get("ref", "")
        engines.append((BASELINE, f"ours at the baseline `{ref}`"))
    lines = [
        "| | " + " | ".join(label for label, *_ in ISSUE_METRICS) + " |",
        "|---|" + "---:|" * len(ISSUE_METRICS),
    ]
    for engine, label in engines:
        cells = [cell(values(res, engine, bench, keys)) for _, bench, keys, _ in ISSUE_METRICS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    others = [(e, name.split(" (")[0]) for e, name in ISSUE_ENGINES]
    if has_baseline(raw):
        others.append((BASELINE, "baseline"))
    for engine, name in others:
        cells = [
            f"**{ratio(m(res, OURS, metric), m(res, engine, metric), metric[3])}**"
            for metric in ISSUE_METRICS
        ]
        lines.append(f"| ours ÷ {name} | " + " | ".join(cells) + " |")
    return lines


def sweep(raw: dict[str, Any]) -> list[str]:
    """Every (processes, concurrency) drained, ours and PgQueuer side by side."""
    res = raw["results"]
    base = has_baseline(raw)
    head = "| processes | concurrency | ours | PgQueuer | ours ÷ PgQueuer |"
    rule = "|---:|---|---:|---:|---:|"
    if base:
        head += " baseline | ours ÷ baseline |"
        rule += "---:|---:|"
    lines = [head, rule]
    for processes in (1, 2):
        for c in CONCURRENCIES:
            bench = drain_key(processes, c)
            ours = values(res, OURS, bench, DRAIN_KEYS)
            pgq = values(res, "pgqueuer", bench, DRAIN_KEYS)
            if not ours and not pgq:
                continue
            label = (
                f"defaults (ours {our_default(res)}; PgQueuer batch 10, no cap)"
                if c is None
                else f"{c} (PgQueuer: batch {max(1, c // 2)}, cap {c})"
            )
            row = [str(processes), label, cell(ours), cell(pgq), ratio(med(ours), med(pgq), True)]
            if base:
                b = values(res, BASELINE, bench, DRAIN_KEYS)
                row += [cell(b), ratio(med(ours), med(b), True)]
            lines.append("| " + " | ".join(row) + " |")
    return lines


def async_sweep(raw: dict[str, Any]) -> list[str]:
    """The async rows: ours draining async no-op runs, PgQueuer at the same cap."""
    res = raw["results"]
    base = has_baseline(raw)
    head = "| processes | concurrency | ours, async | PgQueuer | ours ÷ PgQueuer |"
    rule = "|---:|---|---:|---:|---:|"
    if base:
        head += " baseline | ours ÷ baseline |"
        rule += "---:|---:|"
    lines = [head, rule]
    for processes in (1, 2):
        for c in ASYNC_CONCURRENCIES:
            bench = async_drain_key(processes, c)
            ours = values(res, OURS, bench, DRAIN_KEYS)
            pgq = values(res, "pgqueuer", bench, DRAIN_KEYS)
            if not ours and not pgq:
                continue
            batch = max(1, min(PGQUEUER_BATCH, c // 2))
            label = f"{c} (PgQueuer: batch {batch}, cap {c})"
            row = [str(processes), label, cell(ours), cell(pgq), ratio(med(ours), med(pgq), True)]
            if base:
                b = values(res, BASELINE, bench, DRAIN_KEYS)
                row += [cell(b), ratio(med(ours), med(b), True)]
            lines.append("| " + " | ".join(row) + " |")
    return lines if len(lines) > 2 else []


def best_concurrency(raw: dict[str, Any], processes: int = 1) -> tuple[str, float] | None:
    """The concurrency of our fastest drain with `processes` processes (median jobs/s)."""
    res = raw["results"]
    rates = {
        (str(c) if c else f"default ({our_default(res)})"): med(
            values(res, OURS, drain_key(processes, c), DRAIN_KEYS)
        )
        for c in CONCURRENCIES
    }
    found = {k: v for k, v in rates.items() if v}
    if not found:
        return None
    best = max(found, key=lambda k: found[k])
    return best, found[best]


# -- every engine at eight in flight -------------------------------------------------------


def table(raw: dict[str, Any]) -> list[str]:
    res = raw["results"]
    na = raw.get("na", {})
    lines = [
        "| metric | " + " | ".join(ENGINES) + " |",
        "|---|" + "---:|" * len(ENGINES),
    ]
    for label, bench, keys, _ in CAPPED:
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
    for metric in CAPPED:
        label, bench, keys, higher = metric
        ours = m(res, OURS, metric)
        row = [
            "—"
            if bench == "steps" and p != "dbos"
            else ratio(ours, med(values(res, p, bench, keys)), higher)
            for p in PEERS
        ]
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    return lines


# -- ours against the baseline -------------------------------------------------------------


def has_baseline(raw: dict[str, Any]) -> bool:
    return any(r["engine"] == BASELINE for r in raw["results"])


FLOW_RATES = (
    ("claim_rate_plain", "flow control off: claims/s"),
    ("claim_rate_guarded", "queue limit + keys on: claims/s"),
    ("claim_rate_guarded_without_held_back", "keys on, nothing held back: claims/s"),
    ("scale_held_back_100k", "keys on, one full key's runs held back: claims/s"),
    ("drain_rate_plain", "worker drain, flow control off: runs/s"),
    ("drain_rate_guarded", "worker drain, queue limit + keys on: runs/s"),
    ("claim_rate_no_queue_paused", "no queue paused: claims/s"),
    ("claim_rate_a_queue_paused", "another queue paused (the claim checks): claims/s"),
)


def flow_metrics(res: list[dict[str, Any]]) -> list[Metric]:
    """bench/flow.py's claim rates (its row is "flow")."""
    return [(label, "flow", (key,), True) for key, label in FLOW_RATES]


def baseline_table(raw: dict[str, Any]) -> list[str]:
    res = raw["results"]
    b = raw["baseline"]
    metrics: list[Metric] = [ENQUEUE, P50, P99]
    metrics += [
        (
            f"drain, jobs/s: {p} proc, concurrency {c or 'default'}",
            drain_key(p, c),
            DRAIN_KEYS,
            True,
        )
        for p in (1, 2)
        for c in CONCURRENCIES
    ]
    metrics += [
        (
            f"async drain, jobs/s: {p} proc, concurrency {c}",
            async_drain_key(p, c),
            DRAIN_KEYS,
            True,
        )
        for p in (1, 2)
        for c in ASYNC_CONCURRENCIES
    ]
    metrics += [CAPPED[5], CAPPED[6], *SCALE_KEYS, *flow_metrics(res)]
    lines = [
        f"Ours (this commit) against the baseline, `{b['ref']}` = `{b['commit'][:10]}`, measured"
        " in the same run, each measurement of ours next to one of the baseline's in"
        f" alternating order. Ratio of medians, **above 1{TIMES} means this commit is better**"
        f" (faster, or lower latency); ⚠ marks a row more than 5 % worse.",
        "",
        "| metric | ours | baseline | ours ÷ baseline |",
        "|---|---:|---:|---:|",
    ]
    for metric in metrics:
        label, bench, keys, higher = metric
        ours, base = values(res, OURS, bench, keys), values(res, BASELINE, bench, keys)
        if not ours and not base:
            continue
        r = ratio_value(med(ours), med(base), higher)
        mark = " ⚠" if r is not None and r < 0.95 else ""
        shown = ratio(med(ours), med(base), higher) + mark
        lines.append(f"| {label} | {cell(ours)} | {cell(base)} | {shown} |")
    return lines


# -- single lines -----------------------------------------------------------------------------


def extras(raw: dict[str, Any]) -> list[str]:
    res = raw["results"]
    out = []
    tps = values(res, "pgbench", "pgbench", ("tps",))
    if tps:
        out.append(
            f"- **Physical limit** (pgbench, 8 clients, one INSERT + one `FOR UPDATE SKIP LOCKED`"
            f" claim per transaction): {cell(tps)} transactions/s."
        )
    for r in res:
        if r["engine"] != OURS or "error" in r:
            continue
        if r["bench"] == "scale":
            out.append(
                f"- **Scale** (ours, in-process claim + complete, one at a time):"
                f" {fmt(r['claims_per_s_empty'])} claims/s on an empty table,"
                f" {fmt(r['claims_per_s_loaded'])} with {r['finished']:,} finished and"
                f" {r['waiting']:,} waiting runs in it ({r['ratio']:.2f}{TIMES} the empty rate)."
            )
        elif r["bench"] == "history":
            out.append(
                f"- **History** (ours, bench/history.py: {r['history']:,} finished runs of a"
                f" month in the table against an empty one, medians of {r['rounds']} rounds):"
                f" enqueue {fmt(r['enqueue_per_s_loaded'])}/s against"
                f" {fmt(r['enqueue_per_s_empty'])} ({r['enqueue_ratio']:.2f}{TIMES}),"
                f" claim + complete {fmt(r['claim_complete_per_s_loaded'])}/s against"
                f" {fmt(r['claim_complete_per_s_empty'])} ({r['claim_complete_ratio']:.2f}{TIMES})."
            )
        elif r["bench"] == "flow":
            out.append(
                f"- **Flow control** (ours, in-process claim + complete; bench/flow.py): with a"
                f" queue limit ({r.get('queue_limits', 'on')}) and {r.get('keys', '?')}"
                f" concurrency keys (limit {r.get('key_limit', 1)}; none of them binds)"
                f" {fmt(r['claim_rate_guarded'])} claims/s, with neither"
                f" {fmt(r['claim_rate_plain'])} ({r['ratio']:.2f}{TIMES}); other keys' runs"
                f" with {r['held_back']:,} runs of one full key held back in the same queue:"
                f" {fmt(r['scale_held_back_100k'])} claims/s, against"
                f" {fmt(r['claim_rate_guarded_without_held_back'])} without them"
                f" ({r['held_back_ratio']:.2f}{TIMES})."
            )
            if "paused_check_ratio" in r:
                out.append(
                    f"- **Queue pause** (ours, in-process claim + complete; bench/flow.py): with"
                    f" another queue paused, so that the claim leaves paused queues out,"
                    f" {fmt(r['claim_rate_a_queue_paused'])} claims/s, with none paused"
                    f" {fmt(r['claim_rate_no_queue_paused'])}"
                    f" ({r['paused_check_ratio']:.2f}{TIMES})."
                )
            if "drain_ratio" in r:
                out.append(
                    f"- **Flow control, as a worker drains** (ours, `runworker --burst` on its"
                    f" defaults, {r['drain_runs']:,} runs): keyed runs with the queue limit"
                    f" {fmt(r['drain_rate_guarded'])} runs/s, plain runs without limits"
                    f" {fmt(r['drain_rate_plain'])} ({r['drain_ratio']:.2f}{TIMES})."
                )
    return out


def readme_paragraph(raw: dict[str, Any]) -> str:
    """README.md's benchmark sentence, from the numbers of this run."""
    res = raw["results"]
    minutes = round(raw["wall_seconds"] / 60)

    def r(metric: Metric, engine: str = "pgqueuer", bench: str | None = None) -> str:
        ours = med(values(res, OURS, bench or metric[1], metric[2]))
        return ratio(ours, m(res, engine, metric), metric[3])

    def ms(engine: str, metric: Metric) -> str:
        v = m(res, engine, metric)
        return "n/a" if v is None else f"{v:.1f} ms"

    d1, d2 = headline_metrics(1, None), headline_metrics(2, None)
    text = (
        "`make bench` measures the engine against PgQueuer, Procrastinate, DBOS and"
        " django-tasks-db on a throwaway PostgreSQL cluster (fsync on) in about"
        f" {minutes} minutes; numbers, machine, versions and method are in"
        " [`bench/results.md`](bench/results.md)."
        f" Last run ({raw['when'][:10]}, {raw['machine']['cores']} cores, medians), ours against"
        " PgQueuer with each on its own defaults (PgQueuer: dequeue batch 10, no in-flight cap;"
        f" ours: `runworker`, concurrency {our_default(res)}), above 1{TIMES} meaning ours is"
        f" ahead: drain of {int(raw['args']['jobs']):,} jobs {r(d1)} with one process and"
        f" {r(d2)} with two (ours at `--concurrency 32`: {r(d1, bench=drain_key(1, 32))} and"
        f" {r(d2, bench=drain_key(2, 32))}), enqueue {r(ENQUEUE)}, pickup p50"
        f" {ms(OURS, P50)} vs {ms('pgqueuer', P50)} and p99 {ms(OURS, P99)} vs"
        f" {ms('pgqueuer', P99)}. With every engine at eight in flight: drain"
        f" {r(CAPPED[1])} (one process) and {r(CAPPED[2])} (two) PgQueuer's; 10-step workflows"
        f" {r(CAPPED[5], 'dbos')} DBOS's steps/s"
    )
    scale = next((x for x in res if x["engine"] == OURS and x["bench"] == "scale"), None)
    if scale and "error" not in scale:
        text += (
            f"; the claim rate with {scale['finished']:,} finished and {scale['waiting']:,}"
            f" waiting runs is {scale['ratio']:.2f}{TIMES} the empty table's"
        )
    return text + "."


README_START = "<!-- bench:headline (written by bench/report.py from bench/results.json) -->"
README_END = "<!-- /bench:headline -->"


def update_readme(path: Path, raw: dict[str, Any]) -> None:
    """Replace the paragraph between the markers (wrapped at 100 columns)."""
    import textwrap

    text = path.read_text()
    if README_START not in text or README_END not in text:
        raise SystemExit(f"{path}: no {README_START} ... {README_END} block")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    para = "\n".join(textwrap.wrap(readme_paragraph(raw), 100, break_on_hyphens=False))
    path.write_text(f"{head}{README_START}\n{para}\n{README_END}{tail}")


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
- **drain**: {jobs:,} no-op single-step jobs queued first (batched where the engine can; ours
  are enqueued one by one in one transaction into a template database, once per code tree, and
  each drain starts from a copy of it), then the workers start; jobs/s from the first job
  leaving the queue to the last one finished, or, for an engine that has not emptied the queue
  {drain_seconds:g} s after its first job left it, the jobs finished in those {drain_seconds:g} s.
  Procrastinate, DBOS and django-tasks-db drain a few hundred jobs/s, so they get
  {slow_jobs:,} jobs (still more than they finish in the window) and run at eight in flight
  only. Ours is `bench/engine.py drain` (run timestamps: first `started_at` to last
  `finished_at`); the peers' drivers poll their job table every 10 ms. Two processes: ours is
  **`runworker --processes 2`** (one supervisor, two worker processes), a peer's driver starts
  two worker processes.
- **async drain**: the drain above with an `async def` workflow of one `async def` no-op step
  (`bench_async_noop`, awaited on the worker's event loop) at `--concurrency` 16, 64 and 256,
  against PgQueuer (asyncio-native: its no-op entrypoint is a coroutine on its loop) capped at
  the same concurrency on its default dequeue batch, 10 (8 at concurrency 16: PgQueuer wants
  max_concurrent_tasks at least twice batch_size); {long_reps} repetition(s). Ours is a worker
  of that workflow only (`runworker --task bench_async_noop@1`): it starts no slot thread.
- **pickup latency**: one idle worker, {latency_jobs:,} jobs enqueued 20 ms apart, each in its
  own transaction. **The same method for every engine**: the job itself, first thing in its
  code (for ours: in its step, after the step start is durable), appends its wall-clock start
  (`time.time()`) to a file; the enqueuer takes `time.time()` right after the enqueue call
  returns, i.e. once the commit is acknowledged; latency = start minus commit. Every driver waits
  until its worker says it is set up (ours: listening for wake-ups), then 1 s. The workers run
  on their defaults (ours: `runworker`; PgQueuer: batch 10, no cap), Procrastinate and DBOS at
  concurrency 8.
- **steps**: {workflows:,} ten-step workflows drained by one worker at concurrency 8 (steps/s),
  and the median of 5 single workflows on an idle worker (enqueue → finished).
- **RSS**: peak `VmRSS` of each worker process (and its children), sampled every 50 ms while it
  drains {rss_jobs:,} jobs at concurrency 16 ({rss_reps} repetition(s)).
- **Repetitions**: {reps} of enqueue, latency, steps, pgbench and the headline drains (ours on
  its default and at 32, PgQueuer on its defaults, 1 and 2 processes); {long_reps} of the other
  drains (concurrency 8, 16 and 64), to keep `make bench` near 20 minutes on 2 cores; one of
  the scale and flow-control rows.{baseline}

Per-engine configuration (durable defaults everywhere: fsync and synchronous_commit on, no
unlogged tables):

- **ours**: `manage.py runworker [--concurrency N] [--processes 2]` (LISTEN/NOTIFY on, 5 s
  fallback poll).
- **pgqueuer**: asyncpg driver; on its defaults `QueueManager.run()` (dequeue batch 10, no
  in-flight cap: what its `pgq run` CLI does by default); at concurrency N,
  `run(batch_size=N/2, max_concurrent_tasks=N)`: PgQueuer wants max_concurrent_tasks at least
  twice batch_size, so concurrency 8 dequeues 4 at a time.
- **procrastinate**: `PsycopgConnector`, async task, `run_worker_async(concurrency=N)`.
- **dbos**: queue registered with `worker_concurrency=N` and `polling_interval_sec=0.01` (the
  default 1 s would cap a worker at N workflows per second); a job is a workflow with one step;
  the queue is filled by 8 enqueuing threads (DBOS has no batch enqueue).
- **django-tasks-db**: Django's `django.tasks` with the `DatabaseBackend`, `manage.py db_worker`
  on its defaults; it runs one task at a time (no concurrency setting), so its "8 in flight"
  and "16" rows are really concurrency 1, and it polls every 1 s when idle.
- **celery**: Celery on Redis (`bench/peers/drive_celery.py`): a redis-server of its own on its
  defaults (no journal), `task_acks_late=True`, no result backend; `celery worker` on its
  defaults (prefork pool, one child per CPU, prefetch 4); two processes is two worker
  instances. Enqueue is `delay()`, one publish each; a drain counts a job finished once it has
  left the queue and the unacked set. Measured in the enqueue, pickup and default drain rows
  only.
"""

BASELINE_NOTE = """
- **Baseline**: `--baseline REF` checks REF out with `git worktree add` in a temporary
  directory and runs this commit's `bench/engine.py` and `.venv` on it with `$BENCH_CODE_ROOT`
  (and so `sys.path` and the workers' `PYTHONPATH`) pointing at that tree; every result records
  the `tasks_engine` directory the driver and its worker imported, and one from anywhere else
  (such as the editable install) is an error. Each of our measurements is paired with one of
  the baseline's, the pair's order alternating by repetition."""


def markdown(raw: dict[str, Any], chart: bool) -> str:
    mach = raw["machine"]
    load = raw["load_before"][0]
    res = raw["results"]
    lines = [
        "# Benchmarks: ours vs PgQueuer, Procrastinate, DBOS, django-tasks-db, Celery on Redis",
        "",
        f"Produced by `make bench` (`bench/run_all.py`) on {raw['when']} in"
        f" {raw['wall_seconds'] // 60} min {raw['wall_seconds'] % 60} s; medians of"
        f" {raw['args']['reps']} repetitions (range in small print; {raw['args']['long_reps']}"
        " for the drains outside the headline), raw numbers in `bench/results.json`.",
        "",
    ]
    if raw["args"].get("quick") == "True":
        lines += ["> **Quick run** (`--quick`): small sizes, one repetition; not a result.", ""]
    if load > 0.7:
        lines += [
            f"> **Noisy machine.** It was shared with other engineers' test runs (load average"
            f" {load:.2f} on {mach['cores']} cores just before the run, {raw['load_after'][0]:.2f}"
            " after). Absolute numbers are low and spread; compare engines within a row.",
            "",
        ]
    lines += [f"> {note}" for note in raw.get("notes", [])] + ([""] if raw.get("notes") else [])
    lines += [
        "## Ours, PgQueuer and Celery on Redis, each on its own defaults",
        "",
        f"Medians; above 1{TIMES} in the ratio rows means ours is better (faster, or lower"
        " latency). Enqueue is one job per transaction (Celery: one publish) from one process;"
        f" drains of {int(raw['args']['jobs']):,} no-op jobs. Celery's redis-server runs on its"
        " defaults, which keep no journal: its acknowledged enqueues are in memory, not on disk.",
        "",
        *issue_table(raw),
        "",
        "## Ours and PgQueuer, each on its own defaults",
        "",
        f"Above 1{TIMES} means ours is better. Drains of {int(raw['args']['jobs']):,} no-op jobs;"
        " two processes is `runworker --processes 2` for ours.",
        "",
        *headline(raw),
        "",
        "### Drain by concurrency",
        "",
        *sweep(raw),
    ]
    best = best_concurrency(raw)
    if best:
        lines += [
            "",
            f"Our fastest one-process drain: concurrency {best[0]}, {fmt(best[1])} jobs/s.",
        ]
    asyncs = async_sweep(raw)
    if asyncs:
        lines += [
            "",
            "### Async drain (async def workflows)",
            "",
            f"Async no-op runs (an `async def` workflow, one `async def` step) drained at each"
            f" concurrency against PgQueuer capped at it on its default batch; above 1{TIMES}"
            " means ours is better.",
            "",
            *asyncs,
        ]
    if has_baseline(raw):
        lines += ["", "## Ours against the baseline", "", *baseline_table(raw)]
    lines += ["", "## Every engine at eight in flight", ""]
    if chart:
        lines += ["![benchmark chart](results.png)", ""]
    lines += table(raw)
    lines += ["", *extras(raw)]
    lines += ["", "¹ n/a: see *Failures and n/a* below.", ""]
    fails = failures(raw)
    lines += ["## Failures and n/a", "", *(fails or ["- none: every engine ran every time."]), ""]
    keys = ("jobs", "slow_jobs", "enqueue_jobs", "latency_jobs", "workflows", "rss_jobs")
    sizes: dict[str, Any] = {k: int(raw["args"][k]) for k in keys}
    sizes["drain_seconds"] = float(raw["args"].get("drain_seconds", 0)) or float("inf")
    sizes["reps"] = int(raw["args"]["reps"])
    sizes["long_reps"] = min(int(raw["args"]["long_reps"]), sizes["reps"])
    sizes["rss_reps"] = min(int(raw["args"]["rss_reps"]), sizes["reps"])
    sizes["baseline"] = BASELINE_NOTE if has_baseline(raw) else ""
    lines += ["## Method", "", NOTES.format(**sizes)]
    lines += [
        "## Machine and versions",
        "",
        f"- {mach['cpu']}, {mach['cores']} cores, {mach['memory_gib']} GiB, Linux {mach['kernel']}",
        f"- PostgreSQL {mach['postgresql']} (throwaway cluster, "
        + ", ".join(f"{k}={v}" for k, v in mach["postgresql_settings"].items())
        + ")",
        f"- Python {mach['python']}; ours: {code(mach['our_commit'], raw.get('our_code_after'))}",
        *(
            [f"- baseline: `{raw['baseline']['ref']}` = `{raw['baseline']['commit']}`"]
            if raw.get("baseline")
            else []
        ),
        *versions(raw["versions"]),
        "",
    ]
    del res
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
    """Top: ours and PgQueuer's drain rate by concurrency, each on its defaults too. Bottom:
    every engine at eight in flight."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    res = raw["results"]
    colors = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b"]
    fig = plt.figure(figsize=(15, 9.6))
    grid = fig.add_gridspec(2, 3, width_ratios=[3, 1.6, 1], height_ratios=[1, 1])
    top = fig.add_subplot(grid[0, :])
    capped = [fig.add_subplot(grid[1, i]) for i in range(3)]
    dflt = our_default(res)
    xs = [c for c in CONCURRENCIES if c is not None]
    for e, color in ((OURS, colors[0]), ("pgqueuer", colors[1])):
        for processes, style in ((1, "-"), (2, "--")):
            ys = [med(values(res, e, drain_key(processes, c), DRAIN_KEYS)) for c in xs]
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y]
            label = f"{e}, {processes} process{'es' if processes > 1 else ''}"
            if pts:
                top.plot(*zip(*pts, strict=True), style, marker="o", color=color, label=label)
            d = med(values(res, e, drain_key(processes, None), DRAIN_KEYS))
            if d:
                what = f"default ({dflt})" if e == OURS else "defaults (batch 10, no cap)"
                top.axhline(d, color=color, linestyle=style, linewidth=0.8, alpha=0.6)
                top.annotate(
                    f"{label}, {what}: {d:,.0f}/s",
                    (1.0, d),
                    xycoords=("axes fraction", "data"),
                    ha="right",
                    fontsize=8,
                    color=color,
                    textcoords="offset points",
                    xytext=(-4, 3),
                )
    top.set_xscale("log", base=2)
    top.set_xticks(xs, [str(x) for x in xs])
    top.set_xlabel("concurrency (PgQueuer: cap; batch = cap / 2); lines: each on its defaults")
    top.set_ylabel("jobs/s")
    top.set_title(
        f"drain of {int(raw['args']['jobs']):,} no-op jobs (higher is better)", fontsize=10
    )
    top.grid(alpha=0.3)
    top.legend(fontsize=8, loc="lower left")
    panels: list[tuple[Any, str, str, list[tuple[str, str, tuple[str, ...]]]]] = [
        (
            capped[0],
            "every engine at 8 in flight (higher is better)",
            "per second, log scale",
            [
                ("enqueue", "enqueue", ("per_s",)),
                ("drain 1 proc", drain_key(1, 8), DRAIN_KEYS),
                ("drain 2 procs", drain_key(2, 8), DRAIN_KEYS),
                ("steps (10-step wf)", "steps", ("steps_per_s",)),
            ],
        ),
        (
            capped[1],
            "pickup latency, idle worker (lower is better)",
            "ms, log scale",
            [("p50", "latency", ("p50_ms",)), ("p99", "latency", ("p99_ms",))],
        ),
        (capped[2], "worker RSS at concurrency 16", "MiB", [("peak RSS", "rss", ("rss_mib",))]),
    ]
    width = 0.8 / len(ENGINES)
    for ax, title, ylabel, groups in panels:
        for i, e in enumerate(ENGINES):
            bx, by = [], []
            for g, (_, bench, keys) in enumerate(groups):
                v = med(values(res, e, bench, keys))
                if v:
                    bx.append(g + (i - (len(ENGINES) - 1) / 2) * width)
                    by.append(v)
            ax.bar(bx, by, width, label=e, color=colors[i])
        ax.set_xticks(range(len(groups)), [g[0] for g in groups])
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        if "log" in ylabel and ax.patches:  # (a run of some sections may have no bars here)
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    tps = med(values(res, "pgbench", "pgbench", ("tps",)))
    if tps:
        capped[0].axhline(tps, color="black", linestyle="--", linewidth=1)
        capped[0].annotate(
            f"pgbench INSERT+claim, 8 clients: {tps:,.0f}/s",
            (0.01, tps),
            xycoords=("axes fraction", "data"),
            textcoords="offset points",
            xytext=(0, 3),
            fontsize=8,
        )
    fig.legend(*capped[0].get_legend_handles_labels(), loc="lower center", ncols=len(ENGINES))
    mach = raw["machine"]
    fig.suptitle(
        f"Medians · PostgreSQL {mach['postgresql']}, fsync on · {mach['cores']} cores ·"
        f" {raw['when']}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=100)
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("results", type=Path, nargs="?", default=Path(__file__).parent / "results.json")
    p.add_argument("--readme", type=Path, help="also rewrite this README's benchmark sentence")
    a = p.parse_args()
    raw = json.loads(a.results.read_text())
    chart = plot(raw, a.results.with_name("results.png"))
    if not chart:
        raw.setdefault("na", {})["chart"] = "matplotlib not available: no results.png"
    a.results.with_name("results.md").write_text(markdown(raw, chart))
    print(f"wrote {a.results.with_name('results.md')}" + (" and results.png" if chart else ""))
    print("\n".join(issue_table(raw)))
    if a.readme:
        update_readme(a.readme, raw)
        print(f"updated the benchmark sentence of {a.readme}")


if __name__ == "__main__":
    main()
