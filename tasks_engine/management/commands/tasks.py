"""manage.py tasks enqueue | signal | cancel | retry | inspect | list | cancel-matching |
retry-matching | prune | partition | workers | health | replay-check | schedules | schedule |
queues | queue."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from pydantic import ValidationError

from tasks_engine import engine
from tasks_engine.definitions import registry
from tasks_engine.exceptions import (
    IdempotencyConflict,
    TransactionPoolerError,
    UnknownRunError,
    UnknownScheduleError,
    UnknownStepError,
    UnknownTaskError,
)
from tasks_engine.models import WorkflowRun
from tasks_engine.operations import bulk
from tasks_engine.states import RunStatus
from tasks_engine.values import tags as run_tags
from tasks_engine.values.secrets import mask_secrets

from ..cli import (
    OneLineErrors,
    _one_line,
    ahead_periods,
    json_value,
    positive_int,
    queue_name,
    retention_days,
)


class Command(OneLineErrors, BaseCommand):
    help = "Enqueue, signal, cancel, retry, inspect, list and prune durable runs."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        def add(name: str, help: str) -> argparse.ArgumentParser:
            p = sub.add_parser(name, help=help, description=help)
            _one_line(p)
            return p

        p = add("enqueue", "start a run of a workflow, or one per input line (--inputs)")
        p.add_argument("name", help="workflow name (NAME or NAME@VERSION)")
        given = p.add_mutually_exclusive_group()
        given.add_argument(
            "--input", type=json_value, default={}, help="input as JSON (default: {})"
        )
        given.add_argument(
            "--inputs",
            metavar="FILE",
            help="one JSON input per line ('-': standard input): a run each, in one"
            " transaction, all or none",
        )
        p.add_argument("--tag", action="append", default=[], metavar="K=V", help="tag the runs")
        p.add_argument("--queue", help="queue (default: the workflow's)")
        p.add_argument("--idempotency-key", help="dedupe runs of this task by key")
        p.add_argument(
            "--queueing-key", help="while a run with this key waits to start, answer that run"
        )
        p.add_argument(
            "--debounce-key",
            help="the debounce key (a workflow with debounce=): while its window's run waits,"
            " give it this input",
        )
        p.add_argument("--priority", type=int, help="higher runs first (default: workflow's)")
        p.add_argument("--json", action="store_true", help="print JSON")

        p = add("signal", "deliver a fact to a run")
        p.add_argument("run_id", help="run id (UUID)")
        p.add_argument("name", help="fact name")
        p.add_argument("--payload", type=json_value, default=None, help="payload as JSON")
        p.add_argument(
            "--idempotency-key", help="the same key for the same run stores one fact, once"
        )
        p.add_argument("--json", action="store_true", help="print JSON")

        p = add("cancel", "cancel a run and its children")
        p.add_argument("run_id", help="run id (UUID)")
        p.add_argument("--reason", default="", help="why (stored and shown)")
        p.add_argument("--json", action="store_true", help="print JSON")

        p = add("retry", "send a failed or canceled run back for a fresh pass")
        p.add_argument("run_id", help="run id (UUID)")
        p.add_argument("--from-step", help="run this step and every later one again")
        p.add_argument("--reason", default="", help="why (stored and shown)")
        p.add_argument("--json", action="store_true", help="print JSON")

        p = add("inspect", "show a run with its steps")
        p.add_argument("run_id", help="run id (UUID)")
        p.add_argument("--json", action="store_true", help="print JSON")

        p = add("list", "list recent runs")
        p.add_argument("--status", choices=RunStatus.values, help="only runs in this status")
        p.add_argument("--task", help="only runs of this workflow")
        p.add_argument("--version", type=positive_int, help="only runs of this version")
        p.add_argument(
            "--tag", action="append", default=[], metavar="K=V", help="only runs with this tag"
        )
        p.add_argument("--limit", type=positive_int, default=50, help="(default: %(default)r)")
        p.add_argument("--json", action="store_true", help="print JSON")

        for name, verb, help in (
            ("cancel-matching", "cancel", "cancel every unfinished run that matches"),
            ("retry-matching", "retry", "retry every failed or canceled run that matches"),
        ):
            p = add(name, f"{help} (at least one filter; progress on stderr)")
            p.add_argument("--task", help="only runs of this workflow")
            p.add_argument("--status", choices=RunStatus.values, help="only runs in this status")
            p.add_argument("--queue", help="only runs of this queue")
            p.add_argument(
                "--tag", action="append", default=[], metavar="K=V", help="only runs with it"
            )
            p.add_argument(
                "--reason", required=verb == "cancel", default="", help="why (stored and shown)"
            )
            p.add_argument("--json", action="store_true", help="print JSON")

        p = add(
            "prune",
            "delete finished runs (and dispatched outbox events) older than DAYS, or, without "
            "--older-than, past their retention (TASKS_ENGINE RETENTION_DAYS, OUTBOX "
            "RETENTION_DAYS): the leader's retention service, run by hand",
        )
        p.add_argument(
            "--older-than",
            type=retention_days,
            default=None,
            metavar="DAYS",
            help="age in days, for every finished status (default: the retention settings)",
        )
        p.add_argument("--json", action="store_true", help="print JSON")

        p = add(
            "partition",
            "PostgreSQL with TASKS_ENGINE PARTITION: partition the run tables if they are not yet"
            " (migrate does it too) and make the current and next periods' partitions",
        )
        p.add_argument(
            "--ahead",
            type=ahead_periods,
            default=2,
            metavar="N",
            help="periods made ahead of the current one, 0 to 24 (default: %(default)r)",
        )
        p.add_argument("--json", action="store_true", help="print JSON")

        p = add("schedules", "list schedules: next fire, last fired run, paused")
        p.add_argument("--json", action="store_true", help="print JSON")

        p = add("schedule", "pause or resume a schedule")
        p.add_argument("op", choices=["pause", "resume"], help="pause or resume")
        p.add_argument("schedule", metavar="NAME", help="schedule name")
        p.add_argument("--json", action="store_true", help="print JSON")

        p = add("queues", "list queues: paused, limits in effect, pending and running runs")
        p.add_argument("--json", action="store_true", help="print JSON")

        p = add("queue", "pause or resume a queue (every worker, within one poll interval)")
        p.add_argument("op", choices=["pause", "resume"], help="pause or resume")
        p.add_argument("queue", metavar="NAME", type=queue_name, help="queue name")
        p.add_argument("--reason", help="why (pause only; shown by `tasks queues`)")
        p.add_argument("--json", action="store_true", help="print JSON")

        p = add("workers", "list worker processes, the runs they hold, and the leader")
        p.add_argument("--json", action="store_true", help="print JSON")

        p = add(
            "health",
            "exit 0 when the database answers, every migration is applied and every task version"
            " with due runs has a live worker; else exit 1, one line per problem (writes nothing)",
        )
        p.add_argument("--json", action="store_true", help='print {"ok": ..., "problems": [...]}')

        p = add(
            "replay-check",
            "replay every unfinished run's history against this code (no step runs, nothing is"
            " written); list the runs that no longer match, exit 1 if any",
        )
        p.add_argument("--task", help="only runs of this workflow")
        p.add_argument("--json", action="store_true", help="print a JSON array of mismatches")

    def execute(self, *args: Any, **options: Any) -> Any:
        if options.get("action") == "health":
            # A probe reads only what it reports on. The system checks open the database
            # (JSONField asks SQLite what it supports), which creates a missing SQLite file.
            options["skip_checks"] = True
        return super().execute(*args, **options)

    def handle(self, *args: Any, **opts: Any) -> None:
        action = opts["action"]
        try:
            result = getattr(self, f"do_{action.replace('-', '_')}")(opts)
        except (
            UnknownRunError,
            UnknownTaskError,
            UnknownScheduleError,
            UnknownStepError,
            IdempotencyConflict,
            TransactionPoolerError,
        ) as exc:
            raise CommandError(str(exc.args[0] if exc.args else exc)) from exc
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "input"
            raise CommandError(f"invalid input: {where}: {first.get('msg')}") from exc
        except (ValueError, TypeError) as exc:  # a bad argument the engine refused, unwritten
            raise CommandError(str(exc)) from exc
        if opts["json"]:
            self.stdout.write(json.dumps(result["json"], indent=None, default=str))
        else:
            self.stdout.write(result["text"])
        if result.get("exit"):
            self.stdout.flush()
            sys.exit(result["exit"])

    def do_enqueue(self, o: dict[str, Any]) -> dict[str, Any]:
        name, at, version = o["name"].partition("@")
        if at and not (version.isascii() and version.isdigit()):  # before anything is written
            raise CommandError(f"expected NAME or NAME@VERSION, got {o['name']!r}")
        tags = run_tags.parse_pairs(o["tag"]) or None
        if o["inputs"] is not None:
            return self._enqueue_many(name, int(version) if at else None, tags, o)
        res = engine.enqueue(
            name,
            o["input"],
            version=int(version) if at else None,
            idempotency_key=o["idempotency_key"],
            queueing_key=o["queueing_key"],
            debounce_key=o["debounce_key"],
            priority=o["priority"],
            queue=o["queue"],
            tags=tags,
        )
        text = f"{res.run_id}" + (" (deduplicated)" if res.deduplicated else "")
        return {"json": {"run_id": str(res.run_id), "deduplicated": res.deduplicated}, "text": text}

    def _enqueue_many(
        self, name: str, version: int | None, tags: dict[str, str] | None, o: dict[str, Any]
    ) -> dict[str, Any]:
        if any(o[k] is not None for k in ("idempotency_key", "queueing_key", "debounce_key")):
            raise CommandError(
                "--inputs takes no --idempotency-key, --queueing-key or --debounce-key"
            )
        inputs = _input_lines(o["inputs"])
        task = registry.get(name, version)  # UnknownTaskError before anything is read further
        done = engine.enqueue_many(
            task, inputs, queue=o["queue"], priority=o["priority"], tags=tags
        )
        rows = [{"run_id": str(r.run_id), "deduplicated": r.deduplicated} for r in done]
        text = "\n".join(
            f"{r.run_id}" + (" (deduplicated)" if r.deduplicated else "") for r in done
        )
        return {"json": rows, "text": text or "(no inputs)"}

    def do_cancel_matching(self, o: dict[str, Any]) -> dict[str, Any]:
        count = bulk.cancel_runs(
            **_filters(o), reason=o["reason"] or None, progress=self._progress("canceled")
        )
        return {"json": {"canceled": count}, "text": f"canceled {count} runs"}

    def do_retry_matching(self, o: dict[str, Any]) -> dict[str, Any]:
        count = bulk.retry_runs(
            **_filters(o),
            reason=o["reason"] or None,
            by=_operator(),
            progress=self._progress("retried"),
        )
        return {"json": {"retried": count}, "text": f"retried {count} runs"}

    def _progress(self, verb: str) -> bulk.Progress:
        def report(changed: int, seen: int) -> None:
            self.stderr.write(f"{verb} {changed} of {seen} matching runs so far")
            self.stderr.flush()

        return report

    def do_signal(self, o: dict[str, Any]) -> dict[str, Any]:
        res = engine.signal(
            o["run_id"], o["name"], o["payload"], idempotency_key=o["idempotency_key"]
        )
        text = ("delivered" if res.delivered else "not delivered") + f" (run is {res.status})"
        return {"json": {"delivered": res.delivered, "status": res.status}, "text": text}

    def do_cancel(self, o: dict[str, Any]) -> dict[str, Any]:
        ok = engine.cancel(o["run_id"], o["reason"] or None)
        text = "canceled" if ok else "not canceled: the run has already finished"
        return {"json": {"canceled": ok}, "text": text}

    def do_retry(self, o: dict[str, Any]) -> dict[str, Any]:
        ok = engine.retry_run(
            o["run_id"], from_step=o["from_step"], reason=o["reason"] or None, by=_operator()
        )
        text = "retried" if ok else f"not retried: {_retry_refusal(o['run_id'])}"
        return {"json": {"retried": ok}, "text": text}

    def do_health(self, o: dict[str, Any]) -> dict[str, Any]:
        from tasks_engine.services.health import check_health

        health = check_health()
        text = "\n".join(health.problems) if health.problems else "ok"
        return {"json": health.to_dict(), "text": text, "exit": 0 if health.ok else 1}

    def do_inspect(self, o: dict[str, Any]) -> dict[str, Any]:
        engine._run_id(o["run_id"])
        view = engine.get_run(o["run_id"])
        if view is None:
            raise UnknownRunError(f"no run with id {o['run_id']}")
        data = _masked(view.to_dict())
        lines = [
            f"{view.task_name}@{view.version}  {view.run_id}  {view.status}",
            f"  queue={view.queue} priority={view.priority} attempts={view.attempts}"
            f" created={data['created_at']} finished={data['finished_at']}",
        ]
        if view.waiting_on:
            lines.append(f"  waiting on {view.waiting_on} until {data['available_at']}")
        if error := data["error"]:
            lines.append(f"  error: {error.get('type')}: {error.get('message')}")
        for s in data["steps"]:
            err = f"  {s['error']['message']}" if s["error"] else ""
            old = " (superseded)" if s["superseded"] else ""
            lines.append(
                f"  - {s['name']:<30} {s['kind']:<10} #{s['attempt']} {s['status']}{old}{err}"
            )
        for r in view.retries:
            why = f": {r['reason']}" if r.get("reason") else ""
            since = f" from step {r['from_step']}" if r.get("from_step") else ""
            lines.append(f"  retried {r['at']} by {r.get('by') or '?'}{since}{why}")
        if data["output"] is not None:
            lines.append(f"  output: {json.dumps(data['output'])}")
        return {"json": data, "text": "\n".join(lines)}

    def do_list(self, o: dict[str, Any]) -> dict[str, Any]:
        views = engine.list_runs(
            task=o["task"],
            status=o["status"],
            version=o["version"],
            tags=run_tags.parse_pairs(o["tag"]) or None,
            limit=o["limit"],
        )
        lines = [
            f"{v.run_id}  {v.task_name}@{v.version:<3} {v.status:<10}"
            f" {v.created_at:%Y-%m-%d %H:%M:%S}"
            for v in views
        ]
        masked = [_masked(v.to_dict()) for v in views]
        return {"json": masked, "text": "\n".join(lines) or "(no runs)"}

    def do_prune(self, o: dict[str, Any]) -> dict[str, Any]:
        from tasks_engine.services import retention

        if o["older_than"] is None:
            counts = retention.prune_expired()
        else:
            counts = retention.prune(timedelta(days=o["older_than"]))
        text = ", ".join(f"{k}: {v}" for k, v in counts.items())
        return {"json": counts, "text": f"pruned {text}"}

    def do_partition(self, o: dict[str, Any]) -> dict[str, Any]:
        from tasks_engine.db.partitions import unit
        from tasks_engine.db.partitions.setup import turn_on

        if unit() is None:
            raise CommandError(
                "TASKS_ENGINE PARTITION is not set, or the engine's database is not PostgreSQL:"
                " nothing to partition"
            )
        converted, made = turn_on(o["ahead"])
        result = {"converted": converted, "created": made}
        text = f"converted: {', '.join(converted) or '-'}; created: {', '.join(made) or '-'}"
        return {"json": result, "text": text}

    def do_schedules(self, o: dict[str, Any]) -> dict[str, Any]:
        from tasks_engine import clock
        from tasks_engine.schedules import list_schedules

        # next= is the slot that fires next; "(missed)" when it has passed with no leader to
        # fire it: the leader fires it (the latest missed slot) as soon as it runs.
        views, now = list_schedules(), clock.now()
        lines = [
            f"{v.name:<24} {v.task:<24} {v.cron:<16} {v.timezone:<16}"
            f" {'paused' if v.paused else 'active':<7}"
            f" next={v.next_fire_at.isoformat() if v.next_fire_at else '-'}"
            f"{' (missed)' if v.next_fire_at and v.next_fire_at <= now else ''}"
            f" last_run={v.last_run_id or '-'}"
            for v in views
        ]
        return _listing(views, lines, "(no schedules)")

    def do_schedule(self, o: dict[str, Any]) -> dict[str, Any]:
        from tasks_engine import schedules

        name, pause = o["schedule"], o["op"] == "pause"
        changed = schedules.pause(name) if pause else schedules.resume(name)
        state = "paused" if pause else "resumed"
        text = (
            f"{state} {name}" if changed else f"{name} was {'already' if pause else 'not'} paused"
        )
        return {"json": {"name": name, "paused": pause, "changed": changed}, "text": text}

    def do_queues(self, o: dict[str, Any]) -> dict[str, Any]:
        from tasks_engine.operations.queues import list_queues

        views = list_queues()
        lines = [
            f"{v.name:<24} {'paused' if v.paused else 'active':<7}"
            f" concurrency={v.concurrency or '-'} rate_limit={v.rate_limit or '-'}"
            f"{' (overridden: ' + ', '.join(v.overridden) + ')' if v.overridden else ''}"
            f" pending={v.pending} running={v.running}"
            f"{'  reason: ' + v.reason if v.reason else ''}"
            for v in views
        ]
        return _listing(views, lines, "(no queues)")

    def do_queue(self, o: dict[str, Any]) -> dict[str, Any]:
        from tasks_engine.operations.queues import pause_queue, resume_queue

        name, pause = o["queue"], o["op"] == "pause"
        if not pause and o["reason"] is not None:
            raise CommandError("--reason is for pause only")
        changed = pause_queue(name, reason=o["reason"]) if pause else resume_queue(name)
        state = "paused" if pause else "resumed"
        text = (
            f"{state} {name}" if changed else f"{name} was {'already' if pause else 'not'} paused"
        )
        return {"json": {"name": name, "paused": pause, "changed": changed}, "text": text}

    def do_workers(self, o: dict[str, Any]) -> dict[str, Any]:
        from tasks_engine.services.fleet import list_workers

        views = list_workers()
        lines = [
            f"{v.id}  {'alive' if v.alive else 'DEAD':<5}{'  leader' if v.leader else ''}"
            f"  runs {len(v.runs)}/{v.concurrency}  queues {','.join(v.queues) or 'all'}"
            f"  beat {v.last_heartbeat:%H:%M:%S}  started {v.started_at:%Y-%m-%d %H:%M:%S}"
            for v in views
        ]
        return _listing(views, lines, "(no workers)")

    def do_replay_check(self, o: dict[str, Any]) -> dict[str, Any]:
        from tasks_engine.definitions import registry
        from tasks_engine.runtime import replay_check

        task = o["task"]
        known = task is None or any(n == task for n, _ in registry.pairs())
        if not known and not WorkflowRun.objects.filter(task_name=task).exists():
            raise UnknownTaskError(f"unknown task {task!r}")
        checked, found = replay_check.check(task)
        lines = [f"{m.run_id}  {m.task}@{m.version}: {m.problem}" for m in found]
        lines.append(
            f"{len(found)} of {checked} unfinished runs no longer match the code"
            if found
            else f"all {checked} unfinished runs match the code"
        )
        return {
            "json": [m.to_dict() for m in found],
            "text": "\n".join(lines),
            "exit": 1 if found else 0,
        }


def _masked(run: dict[str, Any]) -> dict[str, Any]:
    """A run view's dict as `tasks inspect` shows it: what the workflow stored (input, output,
    error, progress, step outputs and errors) with secrets masked; the API keeps them."""
    masked = {**run, **{k: mask_secrets(run[k]) for k in ("input", "output", "error", "progress")}}
    masked["steps"] = [
        {**s, "output": mask_secrets(s["output"]), "error": mask_secrets(s["error"])}
        for s in run["steps"]
    ]
    return masked


def _listing(views: Sequence[Any], lines: list[str], empty: str) -> dict[str, Any]:
    """A listing's output: the views' dicts as JSON, or one line each (`empty` for none)."""
    return {"json": [v.to_dict() for v in views], "text": "\n".join(lines) or empty}


def _retry_refusal(run_id: str) -> str:
    """Why a retry just answered False (read after it: a run pruned meanwhile is gone)."""
    try:
        return engine.retry_refusal(run_id) or "the run changed meanwhile; look again"
    except UnknownRunError:
        return "the run is gone"


def _filters(o: dict[str, Any]) -> dict[str, Any]:
    """The filters of cancel-matching and retry-matching (bulk.matching refuses none)."""
    return {
        "task": o["task"],
        "status": o["status"],
        "queue": o["queue"],
        "tags": run_tags.parse_pairs(o["tag"]) or None,
    }


def _input_lines(path: str) -> list[Any]:
    """`--inputs`: one JSON value per line, blank lines skipped; a line that is not JSON is a
    CommandError naming it, before anything is written."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"--inputs {path}: {exc}") from exc
    inputs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            inputs.append(json.loads(line))
        except ValueError as exc:
            raise CommandError(f"--inputs {path}: line {number} is not JSON: {exc}") from exc
    return inputs


def _operator() -> str:
    """Who retried from the command line, for the run's retry history."""
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"
