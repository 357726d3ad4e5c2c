"""The engine's tables. Run and step state is written only by `transitions/`; `engine.signal` adds
facts and `runtime/fencing.py` keeps the op ledger."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from .clock import new_run_id
from .states import RunStatus, StepKind, StepStatus

# A queued run: pending and never started, and not put back by an operator's retry (a retried
# run is that operator's, not a request to merge). A queueing key holds at most one
# (run_queueing_key_unique); engine.enqueue looks the holder up by the same fields.
QUEUED = {"status": "pending", "started_at__isnull": True, "retries__isnull": True}


class WorkflowRun(models.Model):
    # Time-ordered (version 7): clock.new_run_id says why.
    id = models.UUIDField(primary_key=True, default=new_run_id, editable=False)
    task_name = models.CharField(max_length=200)
    version = models.PositiveIntegerField(default=1)
    queue = models.CharField(max_length=100, default="default")
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.PENDING)
    priority = models.IntegerField(default=0)
    input = models.JSONField(default=dict)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    # NULL, not "": runs without a key must not collide in the unique constraint.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    input_hash = models.CharField(max_length=64, blank=True)
    # "": the run's trace id is its own id (tracing.run_trace_id; RunView.trace_id).
    trace_id = models.CharField(max_length=64, blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="Claims so far.")
    failures = models.PositiveIntegerField(
        default=0, help_text="Failed passes since the run was created or last retried by hand."
    )
    # Passes before the last operator retry: a pass is numbered failures + pass_offset + 1.
    pass_offset = models.PositiveIntegerField(default=0, db_default=0)
    # Operator retries, oldest first: {"at", "by", "reason", "from_step"} (retry_run).
    retries = models.JSONField(null=True, blank=True)
    # Someone blocks in tasks_engine.wait() on this run: its end sends a NOTIFY (PostgreSQL).
    awaited = models.BooleanField(default=False, db_default=False)
    worker_id = models.CharField(max_length=200, blank=True)
    lease_token = models.UUIDField(null=True, blank=True)
    # One column, three meanings by status: pending = due time, running = lease expiry,
    # waiting = wake time (NULL: no timer). Each status has its own partial index on it.
    available_at = models.DateTimeField(null=True, blank=True)
    # When the run was due at its latest claim (its available_at just before): the claim
    # delay metric reads it from the claim's RETURNING, which only sees the new available_at.
    due_at = models.DateTimeField(null=True, blank=True)
    waiting_on = models.CharField(max_length=300, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_reason = models.TextField(blank=True)
    # Indexed below only where set: most runs have no parent, and a full index would take an
    # entry (for NULL) on every write of every run.
    parent_run = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        db_index=False,
    )
    parent_step = models.CharField(max_length=300, blank=True)
    progress = models.JSONField(null=True, blank=True)
    unreached_steps = models.JSONField(default=list, blank=True)
    # Flow control (docs/FLOW_CONTROL.md): at most `concurrency_limit` runs with the same key
    # run at once. The limit is stored with the run because the claim, which enforces it, is
    # SQL and cannot ask the registry.
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    # At most one queued run per key: while a run with the key waits to start for the first
    # time, an enqueue with the same key returns that run (run_queueing_key_unique).
    queueing_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    # Debounce (docs/FLOW_CONTROL.md): while a run of the workflow with the key is queued, an
    # enqueue with the same key gives it its input and pushes its due time back, up to
    # `debounce_until` (the window's first enqueue + debounce_max; NULL: no cap).
    debounce_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    debounce_until = models.DateTimeField(null=True, blank=True)
    # A rate limit per key: at most N claims of the key's runs in any window ("N/s", "N/m",
    # "N/h"), kept per key in RateKeyLog. Runs with a rate key are claimed by the rate claim
    # only (flow_rate_claims.py): they are in none of the other claims' indexes.
    rate_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    rate_limit = models.CharField(max_length=32, blank=True, default="", db_default="")
    # Pairs to find runs by (tasks_engine/tags.py). NULL without any: no entry in the tag
    # index, which exists on PostgreSQL only (migration 0016: GIN jsonb_path_ops).
    tags = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        permissions = [
            ("cancel_workflowrun", "Can cancel workflow runs"),
            ("retry_workflowrun", "Can retry workflow runs"),
            ("deliver_fact_workflowrun", "Can deliver facts to workflow runs"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["task_name", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="run_idempotency_key_unique",
            ),
            # Only enqueue writes a row into the queued set, so it is the only write that can
            # meet this constraint.
            models.UniqueConstraint(
                fields=["queueing_key"],
                condition=Q(queueing_key__isnull=False, **QUEUED),
                name="run_queueing_key_unique",
            ),
            # Like run_queueing_key_unique, per workflow: the debounced run of a window.
            models.UniqueConstraint(
                fields=["task_name", "debounce_key"],
                condition=Q(debounce_key__isnull=False, **QUEUED),
                name="run_debounce_key_unique",
            ),
            models.CheckConstraint(
                condition=Q(status__in=RunStatus.values), name="run_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status="running") | Q(lease_token__isnull=False),
                name="run_running_has_lease",
            ),
            # With the one above: a run has a lease token exactly while it runs. So a fence is
            # just "id and token match", which only the primary key can answer; a fence that
            # also said status = 'running' could be planned on the lease-expiry index, and
            # scan every running run whenever the statistics lag behind a surge.
            models.CheckConstraint(
                condition=Q(status="running") | Q(lease_token__isnull=True),
                name="run_lease_only_while_running",
            ),
        ]
        indexes = [
            # The claim reads only this index: finished and waiting rows are not in it, nor
            # runs with a concurrency key (held back by it, they would be walked past).
            models.Index(
                fields=["-priority", "available_at"],
                condition=Q(status="pending", concurrency_key__isnull=True, rate_key__isnull=True),
                name="run_claim_pending",
            ),
            # Runs with a rate key: only the rate claim reads them (flow_rate_claims.py).
            models.Index(
                fields=["-priority", "available_at"],
                condition=Q(status="pending", rate_key__isnull=False),
                name="run_claim_rated",
            ),
            # Keyed runs, by key: a guarded claim visits each key once (a loose index scan),
            # however many runs the key holds back.
            models.Index(
                fields=["concurrency_key", "-priority", "available_at"],
                condition=Q(status="pending", concurrency_key__isnull=False),
                name="run_claim_keyed",
            ),
            # Keyed runs in claim order: a guarded claim's first look (the best few keyed
            # runs), before it falls back to visiting each key.
            models.Index(
                fields=["-priority", "available_at"],
                condition=Q(status="pending", concurrency_key__isnull=False),
                name="run_claim_keyed_order",
            ),
            models.Index(
                fields=["concurrency_key"],
                condition=Q(status="running", concurrency_key__isnull=False),
                name="run_running_keyed",
            ),
            models.Index(
                fields=["available_at"], condition=Q(status="running"), name="run_lease_expiry"
            ),
            models.Index(
                fields=["available_at"],
                condition=Q(status="waiting", available_at__isnull=False),
                name="run_wake_due",
            ),
            models.Index(fields=["-created_at"], name="run_created"),
            models.Index(fields=["status", "-created_at"], name="run_status_created"),
            # Only stored trace ids (a caller's): a run's own is its id (tracing.run_trace_id).
            models.Index(fields=["trace_id"], condition=~Q(trace_id=""), name="run_trace_id"),
            models.Index(
                fields=["idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="run_idempotency_key",
            ),
            models.Index(fields=["task_name", "-created_at"], name="run_task_created"),
            models.Index(
                fields=["finished_at"], condition=Q(finished_at__isnull=False), name="run_finished"
            ),
            models.Index(
                fields=["parent_run"], condition=Q(parent_run__isnull=False), name="run_parent"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_name}@{self.version} {self.id} ({self.status})"


class QueueClaim(models.Model):
    """A claim that started runs of a rate-limited queue: when, and how many (one row per
    claim, not per run). The sliding window's log: the claim that adds a row also deletes
    those older than the window, so a queue keeps at most its rate's N rows (and a few that
    left the window since the last claim)."""

    queue = models.CharField(max_length=100)
    claimed_at = models.DateTimeField()
    # The queue's started runs numbered 1, 2, ...: a row's `seq` is the number of its last run,
    # its `claims` how many it started (its first is seq - claims + 1); times never go back
    # along the sequence, so the rows in the window are the last ones, and the runs they
    # started number the newest's seq less the oldest's first plus one (two probes).
    seq = models.BigIntegerField(default=0)
    # A default in the database too: during a rolling deploy, workers of the release before
    # migration 0014 still insert a row per run without it (each row one run, as it reads).
    claims = models.PositiveIntegerField(default=1, db_default=1)

    class Meta:
        indexes = [
            models.Index(fields=["queue", "claimed_at", "seq"], name="queue_claim_window_seq")
        ]
        constraints = [
            models.UniqueConstraint(fields=["queue", "seq"], name="queue_claim_seq_unique")
        ]

    def __str__(self) -> str:
        return f"{self.queue} at {self.claimed_at}"


class StepAttempt(models.Model):
    # No index of its own: step_attempt_unique (run, name, attempt) leads with it.
    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="step_attempts", db_index=False
    )
    name = models.CharField(max_length=300, help_text="Step key: name, or name#n for repeats.")
    kind = models.CharField(max_length=16, choices=StepKind.choices, default=StepKind.FUNCTION)
    status = models.CharField(max_length=16, choices=StepStatus.choices)
    attempt = models.PositiveIntegerField(default=1)
    run_pass = models.PositiveIntegerField(default=1, help_text="Workflow pass (retry) number.")
    counted = models.BooleanField(default=True, help_text="Counts against the retry budget.")
    superseded = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Replaced by a retry from an earlier step; kept as history, ignored by replay.",
    )
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    worker_id = models.CharField(max_length=200, blank=True)
    lease_token = models.UUIDField(null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "name"],
                condition=Q(status="completed", superseded=False),
                name="step_completed_once",
            ),
            models.UniqueConstraint(fields=["run", "name", "attempt"], name="step_attempt_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.attempt} ({self.status})"


class Fact(models.Model):
    # No index of its own: fact_run_name (run, name, id) leads with it.
    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="facts", db_index=False
    )
    name = models.CharField(max_length=200)
    payload = models.JSONField(null=True, blank=True)
    consumed_by = models.CharField(max_length=300, blank=True, help_text="Step key that took it.")
    # signal(..., idempotency_key=K): one fact per (run, K); a repeat answers with the status
    # the first signal answered.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    answered_status = models.CharField(max_length=16, blank=True, db_default="")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["run", "name", "id"], name="fact_run_name")]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="fact_idempotency_key_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} for {self.run_id}"


class OpLedger(models.Model):
    class Status(models.TextChoices):
        STARTED = "started"
        DONE = "done"

    op_key = models.CharField(max_length=300, unique=True)
    run = models.ForeignKey(
        WorkflowRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="ops"
    )
    step_name = models.CharField(max_length=300, blank=True)
    attempt_token = models.UUIDField()
    status = models.CharField(max_length=16, choices=Status.choices)
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = "op ledger entry"
        verbose_name_plural = "op ledger"

    def __str__(self) -> str:
        return f"{self.op_key} ({self.status})"


class Worker(models.Model):
    """A live `runworker` process: written by the worker itself (`tasks_engine.services.fleet`), one
    row per process, beating every couple of seconds; removed when it stops gracefully, or by
    the leader's dead-worker service once its beat is older than DEAD_WORKER_SECONDS."""

    id = models.CharField(
        max_length=200, primary_key=True, help_text="host:pid:random, new per start."
    )
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list, blank=True, help_text="Empty: every queue.")
    tasks = models.JSONField(default=list, blank=True, help_text="NAME@VERSION it serves.")
    concurrency = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    # On the database's clock (PostgreSQL), so beats from many hosts compare with one clock.
    last_heartbeat = models.DateTimeField()
    runs_held = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["started_at"]

    def __str__(self) -> str:
        return self.id


class LeaderLease(models.Model):
    """The maintenance leader's lease: one row per role, on the database's clock. `term` grows
    with every election, and renewal and resignation name it, so a leader that lost its lease
    can never extend or end its successor's (see tasks_engine/services/leader.py)."""

    name = models.CharField(max_length=50, primary_key=True)
    worker_id = models.CharField(max_length=200)
    term = models.PositiveBigIntegerField()
    elected_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        verbose_name = "leader lease"

    def __str__(self) -> str:
        return f"{self.name}: {self.worker_id} (term {self.term})"


class Schedule(models.Model):
    """The state of one named schedule (tasks_engine/schedules/); its definition lives in code
    (`@workflow(schedule=...)`) or settings (`TASKS_ENGINE["SCHEDULES"]`), not here. A row
    outlives its definition (a schedule removed from code keeps its pause and history, and is
    not fired)."""

    name = models.CharField(max_length=200, unique=True)
    # The definition `next_fire_at` was computed for; "" once the schedule is no longer
    # defined. A changed definition starts again from the next slot after the change.
    cron = models.CharField(max_length=200, blank=True)
    timezone = models.CharField(max_length=100, blank=True)
    paused = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    next_fire_at = models.DateTimeField(null=True, blank=True, help_text="Next slot (UTC).")
    last_slot_at = models.DateTimeField(null=True, blank=True, help_text="Last slot fired.")
    last_fired_at = models.DateTimeField(null=True, blank=True, help_text="When it was fired.")
    # No foreign key: runs are pruned with raw deletes, and the id is worth keeping anyway.
    last_run_id = models.UUIDField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]
        permissions = [
            ("pause_schedule", "Can pause and resume schedules"),
            ("run_now_schedule", "Can run schedules now"),
        ]

    def __str__(self) -> str:
        return self.name


class Queue(models.Model):
    """A queue's runtime state (operations/queues.py): paused or not, and limits that override
    `TASKS_ENGINE["QUEUES"]` for it. Queues are open: a queue needs no row, and most have
    none; a row is written the first time an operator pauses a queue or sets its limits.
    Workers read the whole table (a few rows) once per poll interval
    (transitions/queue_state.py)."""

    name = models.CharField(max_length=100, primary_key=True)
    paused = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True, help_text="Why it was paused.")
    # NULL / "": the queue's limit from TASKS_ENGINE["QUEUES"] (none if it has none there).
    concurrency = models.PositiveIntegerField(
        null=True, blank=True, help_text="Runs of the queue running at once, fleet-wide."
    )
    rate_limit = models.CharField(
        max_length=32, blank=True, help_text="Claims of the queue's runs per window: N/s, N/m, N/h."
    )
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]
        permissions = [("pause_queue", "Can pause and resume queues")]

    def __str__(self) -> str:
        return self.name


class RateKeyLog(models.Model):
    """A rate key's recent claims (flow_rate_claims.py): the times of its last N claimed runs,
    oldest first (N: the limit of the runs claimed last). A claim locks the row, admits runs
    while fewer than N times are inside the window ending now, and writes the times back: the
    row lock serialises the key's claims fleet-wide, and the row is the whole truth."""

    key = models.CharField(max_length=255, primary_key=True)
    times = models.JSONField(default=list)
    # Its newest claim: a row whose newest claim left the longest window (an hour) counts
    # nothing, and retention deletes it (flow_rate_claims.prune_idle_keys).
    last_at = models.DateTimeField(null=True, db_index=True)

    def __str__(self) -> str:
        return f"{self.key}: {len(self.times or [])} claims"
