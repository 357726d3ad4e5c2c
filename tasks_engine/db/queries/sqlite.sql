-- complete_deferred --
-- A deferred step completion, fenced on its run's lease (SQLite has one writer: no row lock).
UPDATE tasks_engine_stepattempt
SET status = 'completed', output = %(output)s, finished_at = %(finished_at)s
WHERE id = %(step_id)s AND status = 'running'
  AND EXISTS (SELECT 1 FROM tasks_engine_workflowrun
              WHERE id = %(run_id)s AND lease_token = %(token)s)

-- deferred_written --
-- Whether a deferred completion is already written (by an earlier send of the same attempt).
SELECT 1 FROM tasks_engine_stepattempt
WHERE id = %(step_id)s AND lease_token = %(token)s AND status = 'completed'

-- start_step --
-- A step's attempt, inserted while the attempt holds its run and no cancel is requested.
INSERT INTO tasks_engine_stepattempt (run_id, name, kind, status, attempt, run_pass, counted,
    output, error, worker_id, lease_token, wake_at, started_at, finished_at)
SELECT %(run_id)s, %(name)s, %(kind)s, %(status)s, %(attempt)s, %(run_pass)s, TRUE,
    %(output)s, %(error)s, %(worker_id)s, %(token)s, %(wake_at)s, %(started_at)s,
    %(finished_at)s
WHERE EXISTS (SELECT 1 FROM tasks_engine_workflowrun
              WHERE id = %(run_id)s AND lease_token = %(token)s
                AND cancel_requested_at IS NULL)
RETURNING id

-- complete_run --
-- Running -> completed, if the attempt still holds the run; canceled instead, without the output, if a cancel committed first (postgresql.sql, hot_completes).
UPDATE tasks_engine_workflowrun
SET status = CASE WHEN cancel_requested_at IS NULL THEN 'completed' ELSE 'canceled' END,
    output = CASE WHEN cancel_requested_at IS NULL THEN %(output)s END,
    unreached_steps = %(unreached)s,
    finished_at = %(at)s, updated_at = %(at)s, lease_token = NULL, available_at = NULL,
    waiting_on = '', error = NULL, progress = COALESCE(%(progress)s, progress)
WHERE id = %(run_id)s AND lease_token = %(token)s
RETURNING status

-- claim --
-- The runs a claim takes: expired leases first, then due timers, then pending by priority (see postgresql.sql, claim_ctes). {filters}: the worker's (name, version) pairs and queues; {paused}: the paused queues left out of due timers and pending runs.
WITH expired AS (
    SELECT id, 0 AS src, priority, available_at FROM tasks_engine_workflowrun
    WHERE status = 'running' AND available_at <= %(now)s{filters}
      AND id NOT IN (SELECT value FROM json_each(%(not_these)s))
    ORDER BY available_at LIMIT %(limit)s
), woken AS (
    SELECT id, 1 AS src, priority, available_at FROM tasks_engine_workflowrun
    WHERE status = 'waiting' AND available_at <= %(now)s AND concurrency_key IS NULL
      AND rate_key IS NULL{filters}{paused}
    ORDER BY available_at LIMIT %(limit)s
), due AS (
    SELECT id, 2 AS src, priority, available_at FROM tasks_engine_workflowrun
    WHERE status = 'pending' AND available_at <= %(now)s AND concurrency_key IS NULL
      AND rate_key IS NULL{filters}{paused}
    ORDER BY priority DESC, available_at LIMIT %(limit)s
)
UPDATE tasks_engine_workflowrun SET status = 'running', lease_token = lower(hex(randomblob(16))),
    worker_id = %(worker_id)s, attempts = attempts + 1,
    due_at = CASE WHEN status = 'running' AND due_at > available_at THEN due_at ELSE available_at END,
    available_at = %(lease_until)s, waiting_on = '', started_at = COALESCE(started_at, %(now)s),
    updated_at = %(now)s
WHERE id IN (
    SELECT id FROM (
        SELECT * FROM expired UNION ALL SELECT * FROM woken UNION ALL SELECT * FROM due
    ) AS candidates ORDER BY src, priority DESC, available_at LIMIT %(limit)s
)
RETURNING {columns}

-- claim_filter_tasks --
-- Only the (name, version) pairs the worker registered, as one JSON array parameter.
AND task_name || '@' || version IN (SELECT value FROM json_each(%(task_keys)s))

-- claim_filter_queues --
-- Only the worker's queues, as one JSON array parameter.
AND queue IN (SELECT value FROM json_each(%(queues)s))

-- claim_filter_paused --
-- None of the paused queues (transitions/queue_state.py), as one JSON array parameter.
AND queue NOT IN (SELECT value FROM json_each(%(paused)s))

-- renew_leases --
-- Extend every lease a worker holds (a JSON array of [run, lease token]); runs missing from the result are lost. Plain columns come back, never `col IS [NOT] NULL` (SQLite 3.35 to 3.40 folds such a test in RETURNING as if the column were NOT NULL).
UPDATE tasks_engine_workflowrun SET available_at = %(until)s
WHERE id IN (SELECT json_extract(value, '$[0]') FROM json_each(%(leases)s))
  AND id || ':' || lease_token IN (
      SELECT json_extract(value, '$[0]') || ':' || json_extract(value, '$[1]')
      FROM json_each(%(leases)s))
RETURNING id, lease_token, cancel_requested_at, deadline_at, 1

-- flow_any_keyed --
-- Whether a keyed run is pending, or waiting with a due timer (both on partial indexes).
SELECT 1 FROM tasks_engine_workflowrun WHERE status = 'pending' AND concurrency_key IS NOT NULL
UNION ALL SELECT 1 FROM tasks_engine_workflowrun
WHERE status = 'waiting' AND available_at <= %(now)s AND concurrency_key IS NOT NULL LIMIT 1

-- flow_keys --
-- (key, limit, src, priority, available_at, running) of every key with a claimable run: the pending keys from a loose scan of the keyed index (one probe per key however many runs it holds back), the head's limit; the head's columns read by primary key, one subquery each (a join could be planned as a scan of the table). {filters}: the worker's pairs and queues.
WITH RECURSIVE keys(k) AS (
    SELECT MIN(concurrency_key) FROM tasks_engine_workflowrun
    WHERE status = 'pending' AND concurrency_key IS NOT NULL
    UNION ALL
    SELECT (SELECT MIN(concurrency_key) FROM tasks_engine_workflowrun
            WHERE status = 'pending' AND concurrency_key IS NOT NULL AND concurrency_key > keys.k)
    FROM keys WHERE keys.k IS NOT NULL
), heads AS (
    SELECT keys.k, (SELECT id FROM tasks_engine_workflowrun
                    WHERE status = 'pending' AND concurrency_key = keys.k
                    AND available_at <= %(now)s{filters}
                    ORDER BY priority DESC, available_at LIMIT 1) AS head
    FROM keys WHERE keys.k IS NOT NULL
)
SELECT k, lim, src, priority, available_at, (SELECT COUNT(*) FROM tasks_engine_workflowrun
    WHERE status = 'running' AND concurrency_key = c.k) AS running
FROM (
    SELECT k, (SELECT concurrency_limit FROM tasks_engine_workflowrun WHERE id = head) AS lim,
        2 AS src, (SELECT priority FROM tasks_engine_workflowrun WHERE id = head) AS priority,
        (SELECT available_at FROM tasks_engine_workflowrun WHERE id = head) AS available_at
    FROM heads WHERE head IS NOT NULL
    UNION ALL
    SELECT concurrency_key, concurrency_limit, 1, priority, available_at
    FROM tasks_engine_workflowrun
    WHERE status = 'waiting' AND available_at <= %(now)s AND concurrency_key IS NOT NULL{filters}
) AS c

-- flow_key_running --
-- Running runs of each of the keys (a JSON array).
SELECT concurrency_key, COUNT(*) FROM tasks_engine_workflowrun
WHERE status = 'running' AND concurrency_key IN (SELECT value FROM json_each(%(keys)s))
GROUP BY concurrency_key

-- flow_queue_running --
-- Running runs of a queue.
SELECT COUNT(*) FROM tasks_engine_workflowrun WHERE status = 'running' AND queue = %(queue)s

-- flow_log_prune --
-- A rate-limited queue's claim log: the claims that left the window ending now.
DELETE FROM tasks_engine_queueclaim WHERE queue = %(queue)s AND claimed_at <= %(since)s

-- flow_log_last --
-- A queue's newest log row: its sequence number and time.
SELECT seq, claimed_at FROM tasks_engine_queueclaim WHERE queue = %(queue)s
ORDER BY seq DESC LIMIT 1

-- flow_log_oldest --
-- The queue's oldest claim inside the window: its sequence number and its run count (times never go back along the sequence, so the window's rows are the last ones).
SELECT seq, claims FROM tasks_engine_queueclaim WHERE queue = %(queue)s AND claimed_at > %(since)s
ORDER BY claimed_at, seq LIMIT 1

-- flow_log_add --
-- One log row for a claim's runs of one queue: the sequence number of its last run, and how many it started.
INSERT INTO tasks_engine_queueclaim (queue, seq, claims, claimed_at)
VALUES (%(queue)s, %(seq)s, %(claims)s, %(at)s)

-- flow_candidates_part --
-- One source of a guarded claim's candidates ({i} numbers its parameters; {extra} its own condition; {order} its index's order): due runs of one status, at most %(n{i})s.
SELECT * FROM (
    SELECT id, %(src{i})s AS src, priority, available_at, queue, concurrency_key,
        concurrency_limit FROM tasks_engine_workflowrun
    WHERE status = %(status{i})s AND available_at <= %(now)s{extra}{filters}
    ORDER BY {order} LIMIT %(n{i})s
) AS p{i}

-- flow_claim_update --
-- The runs a guarded claim admitted (a JSON array of ids) become running under fresh leases.
UPDATE tasks_engine_workflowrun SET status = 'running', lease_token = lower(hex(randomblob(16))),
    worker_id = %(worker_id)s, attempts = attempts + 1,
    due_at = CASE WHEN status = 'running' AND due_at > available_at THEN due_at ELSE available_at END,
    available_at = %(lease_until)s, waiting_on = '', started_at = COALESCE(started_at, %(now)s),
    updated_at = %(now)s
WHERE id IN (SELECT value FROM json_each(%(ids)s))
RETURNING {columns}

-- retry_runs --
-- Failed or canceled -> pending, due now, for a batch (transitions/retry.py): each row's pass offset and retry history (JSON text) from %(rows)s, the rest alike.
UPDATE tasks_engine_workflowrun
SET status = 'pending', available_at = %(now)s, updated_at = %(now)s,
    pass_offset = v.value ->> '$.pass_offset', failures = 0, error = NULL, output = NULL,
    finished_at = NULL, cancel_requested_at = NULL, cancel_reason = '', waiting_on = '',
    worker_id = '', unreached_steps = '[]', awaited = %(awaited)s,
    retries = v.value ->> '$.retries'
FROM json_each(%(rows)s) AS v
WHERE tasks_engine_workflowrun.id = v.value ->> '$.id'

-- debounce_extend --
-- A debounce key's queued run (run_debounce_key_unique's row) takes an enqueue's input and becomes due %(due)s, or its debounce_until if that is sooner; only while it is still queued (a claimed run is the last window's: the enqueue inserts the next one).
UPDATE tasks_engine_workflowrun
SET input = %(input)s, input_hash = %(input_hash)s, version = %(version)s,
    available_at = CASE WHEN debounce_until IS NOT NULL AND debounce_until < %(due)s
                        THEN debounce_until ELSE %(due)s END,
    updated_at = %(now)s
WHERE task_name = %(task_name)s AND debounce_key = %(key)s AND status = 'pending'
  AND started_at IS NULL AND retries IS NULL
RETURNING id

-- flow_any_rated --
-- Whether a run with a rate limit key is pending, or waiting with a due timer.
SELECT 1 FROM tasks_engine_workflowrun WHERE status = 'pending' AND rate_key IS NOT NULL
UNION ALL SELECT 1 FROM tasks_engine_workflowrun
WHERE status = 'waiting' AND available_at <= %(now)s AND rate_key IS NOT NULL LIMIT 1

