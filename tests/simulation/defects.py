"""Known engine defects the simulation steps around until they are fixed.

Each entry turns off the rule (or the part of a rule) that reaches the defect, so the rest of
the simulation keeps finding new ones. Remove an entry when its fix lands; the simulation then
checks that case again. `SIM_KNOWN_DEFECTS` overrides the list for one run: a comma-separated
list, or `none` to check everything (`SIM_KNOWN_DEFECTS=none make simulate`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator
from datetime import datetime
from types import SimpleNamespace
from typing import Any

# Every defect the simulation was built to catch is fixed; so are the ones it found (see the
# regression tests in tests/engine/api/test_promises.py, tests/engine/transitions/test_claim.py and
# tests/engine/worker/test_hot_path_faults.py). Add an entry here only with an open issue for it.
KNOWN_DEFECTS: frozenset[str] = frozenset()


def known_defects() -> frozenset[str]:
    raw = os.environ.get("SIM_KNOWN_DEFECTS")
    if raw is None:
        return KNOWN_DEFECTS
    if raw.strip().lower() in ("", "none"):
        return frozenset()
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


DEFECTS = known_defects()


def known(name: str) -> bool:
    """Whether the simulation should still step around defect `name`."""
    return name in DEFECTS


# -- injected defects -------------------------------------------------------------------------
#
# The other way round: an invariant is only worth its keep if it catches the defect it is
# about. `SIM_INJECT` (a comma-separated list of the names below) swaps a maintenance service
# (or a piece of the engine) for a broken copy for one run; the ci profile must then fail with
# that invariant's violation, and pass without it:
#
#     SIM_INJECT=prune-ignores-unfinished-parent SIM_SHRINK=0 HYPOTHESIS_PROFILE=ci \
#         .venv/bin/python -m pytest tests/simulation -q
#
# - reap-ignores-worker              the dead-worker service releases every running run, not
#                                    only the dead workers' (invariant `reap`)
# - reap-keeps-leases                it deletes the dead workers' rows but leaves their runs to
#                                    wait for the lease (invariant `reap`)
# - prune-ignores-unfinished-parent  retention prunes a finished child whose parent is not
#                                    finished (invariant `prune`; the parent then resumes on a
#                                    child that is gone)
# - prune-ignores-unfinished-child   retention prunes a finished parent whose child is not
#                                    finished (invariant `prune`)
# - prune-ignores-status             retention prunes runs that are not finished (invariant
#                                    `prune`)
# - step-timer-ignored               a step timer never fires, and the step does not check it
#                                    as its body returns: a body that outlived its timeout
#                                    completes (invariant `timed-body-not-completed`)
# - atomic-step-autocommits          an atomic step runs outside a transaction: its business
#                                    write commits even when the attempt then fails with its
#                                    timeout (invariant `atomic-write-with-checkpoint`)
# - step-timeout-not-retried         a timed-out attempt fails its step for good, whatever its
#                                    retry policy (invariant `step-timeout-retries`)
# - completion-ignores-deadline      the completion does not check the run's deadline (the
#                                    defect the simulation found, fixed in complete_run): a
#                                    handler that returns past it completes the run (invariant
#                                    `deadline`)
INJECTABLE = frozenset(
    {
        "reap-ignores-worker",
        "reap-keeps-leases",
        "prune-ignores-unfinished-parent",
        "prune-ignores-unfinished-child",
        "prune-ignores-status",
        "step-timer-ignored",
        "atomic-step-autocommits",
        "step-timeout-not-retried",
        "completion-ignores-deadline",
    }
)


def injected() -> frozenset[str]:
    raw = os.environ.get("SIM_INJECT", "")
    names = frozenset(part.strip() for part in raw.split(",") if part.strip())
    unknown = names - INJECTABLE
    if unknown:
        raise ValueError(f"SIM_INJECT: unknown defect {sorted(unknown)[0]!r}, see defects.py")
    return names


def inject(monkeypatch: Any) -> frozenset[str]:
    """Swap in the broken services `SIM_INJECT` names (the sim_env fixture calls this, before
    the harness gates the transitions: a broken transition is gated as the real one)."""
    from tasks_engine import transitions
    from tasks_engine.db import sqlite_bounds
    from tasks_engine.exceptions import StepTimeoutError
    from tasks_engine.runtime import step_api
    from tasks_engine.runtime.step_timeouts import StepTimer
    from tasks_engine.services import retention

    names = injected()
    if names & {"reap-ignores-worker", "reap-keeps-leases"}:
        monkeypatch.setattr(transitions, "reap_dead_workers", functools.partial(_reap, names))
    if names & {n for n in INJECTABLE if n.startswith("prune-")}:
        monkeypatch.setattr(retention, "_prune_batch", functools.partial(_prune_batch, names))
    if "step-timer-ignored" in names:
        monkeypatch.setattr(StepTimer, "fire", lambda self, now, abort: False)
        monkeypatch.setattr(StepTimer, "stop", _stop_unchecked)
    if "atomic-step-autocommits" in names:
        broken = SimpleNamespace(atomic_step=_no_transaction)
        monkeypatch.setattr(step_api, "sqlite_bounds", broken)
        assert sqlite_bounds.atomic_step is not _no_transaction
    if "step-timeout-not-retried" in names:
        real_terminal = step_api._terminal

        def terminal(policy: Any, exc: BaseException, failures: int) -> bool:
            return isinstance(exc, StepTimeoutError) or real_terminal(policy, exc, failures)

        monkeypatch.setattr(step_api, "_terminal", terminal)
    if "completion-ignores-deadline" in names:
        real_complete = transitions.complete_run

        def complete_run(lease: Any, *args: Any, **kwargs: Any) -> str:
            return real_complete(dataclasses.replace(lease, deadline_at=None), *args, **kwargs)

        monkeypatch.setattr(transitions, "complete_run", complete_run)
    return names


def _stop_unchecked(self: Any) -> Any:
    """StepTimer.stop, never finding the timer due."""
    from tasks_engine.exceptions import LeaseLostError

    with self._lock:
        self._done = True
        if self._written_off:
            raise LeaseLostError(f"step {self.key!r} was written off after its timeout")
        return self.fired


@contextlib.contextmanager
def _no_transaction(atomic: Any, step: str = "") -> Iterator[None]:
    """sqlite_bounds.atomic_step, without the step's transaction: each statement commits."""
    yield


def _reap(names: frozenset[str]) -> dict[str, int]:
    """transitions.reap_dead_workers, broken as `names` say."""
    from django.db import connection, transaction

    from tasks_engine import clock
    from tasks_engine.conf import engine_settings
    from tasks_engine.db.sql import db_now_sql, p_dt, placeholders
    from tasks_engine.transitions.dead_workers import RUN, WORKER

    cutoff_sql, cutoff_params = db_now_sql(-engine_settings().dead_worker_seconds)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"SELECT id FROM {WORKER} WHERE last_heartbeat < {cutoff_sql}", cutoff_params)
        dead = [r[0] for r in cur.fetchall()]
        if not dead:
            return {"workers": 0, "runs": 0}
        now = p_dt(clock.now())
        ids = placeholders(len(dead))
        runs = 0
        if "reap-ignores-worker" in names:
            cur.execute(
                f"""UPDATE {RUN} SET available_at = %s
                    WHERE status = 'running' AND available_at > %s""",
                [now, now],
            )
            runs = cur.rowcount
        elif "reap-keeps-leases" not in names:
            cur.execute(
                f"""UPDATE {RUN} SET available_at = %s
                    WHERE status = 'running' AND worker_id IN ({ids}) AND available_at > %s""",
                [now, *dead, now],
            )
            runs = cur.rowcount
        cur.execute(f"DELETE FROM {WORKER} WHERE id IN ({ids})", dead)
        return {"workers": cur.rowcount, "runs": runs}


def _prune_batch(
    names: frozenset[str], statuses: list[str], cutoff: datetime, batch: int
) -> dict[str, int]:
    """retention._prune_batch, broken as `names` say."""
    from django.db import transaction
    from django.db.models import Exists, OuterRef, Q

    from tasks_engine.models import WorkflowRun
    from tasks_engine.services.retention import delete_runs
    from tasks_engine.states import ACTIVE

    with transaction.atomic():
        active = sorted(ACTIVE)
        parent_unfinished = WorkflowRun.objects.filter(
            pk=OuterRef("parent_run_id"), status__in=active
        )
        child_unfinished = WorkflowRun.objects.filter(
            parent_run_id=OuterRef("pk"), status__in=active
        )
        runs = WorkflowRun.objects.filter(finished_at__lt=cutoff)
        if "prune-ignores-status" in names:
            # Any run older than the cutoff, finished or not (created_at: unfinished runs have
            # no finished_at).
            runs = WorkflowRun.objects.filter(
                Q(status__in=statuses, finished_at__lt=cutoff) | Q(created_at__lt=cutoff)
            )
        else:
            runs = runs.filter(status__in=statuses)
        if "prune-ignores-unfinished-parent" not in names:
            runs = runs.exclude(Exists(parent_unfinished))
        if "prune-ignores-unfinished-child" not in names:
            runs = runs.exclude(Exists(child_unfinished))
        ids = list(runs.order_by("created_at").values_list("pk", flat=True)[:batch])
        return delete_runs(ids)
