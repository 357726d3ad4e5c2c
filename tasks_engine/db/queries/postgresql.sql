-- hot_fence --
-- The fence of a hot write, defined once: the run's row (locked FOR SHARE, so a concurrent reclaim waits for the write or the write loses to it) still holds the attempt's lease token. {v}: the write's rows; {unless_canceled}: also refused once a cancel is requested.
EXISTS (SELECT 1 FROM tasks_engine_workflowrun r
        WHERE r.id = {v}.run_id AND r.lease_token = {v}.token{unless_canceled} FOR SHARE)

-- hot_deferred_columns --
-- A deferred step completion's row (`dv`). transitions/hot_sql.py binds these as parameters for a write alone, or as one JSON parameter of rows for a group.
step_id bigint, output jsonb, finished_at timestamptz, run_id uuid, token uuid

-- hot_deferred --
-- The deferred step completions a write carries (CTE `d`), fenced each on its own run's lease. {lookup}: a group's rows come from json_to_recordset, which has no statistics (the planner guesses 100 rows), so each join key is also spelled `= ANY(ARRAY(...))`, which keeps the lookup on the primary key; a write alone needs none. {rows}: a group's rows already fenced (`hot_deferred_fenced`, {fence} empty), a write alone's `dv` ({fence} its fence).
UPDATE tasks_engine_stepattempt s
SET status = 'completed', output = dv.output, finished_at = dv.finished_at
FROM {rows} AS dv
WHERE {lookup}s.id = dv.step_id AND s.status = 'running'{fence}
RETURNING s.id, s.run_id, dv.token

-- hot_deferred_fenced --
-- A group's deferred completions whose runs' leases hold (CTE `fdv`), fenced once per row: as the inner side of the UPDATE's join, a fence in its WHERE was evaluated once per pair of rows (289 lookups for a group of 17, measured).
fdv AS MATERIALIZED (SELECT * FROM dv WHERE {fence})

-- hot_deferred_gated --
-- A group's deferred completions whose runs' leases hold (CTE `fdv`) when the group also completes runs (CTE `c`, before this): a completion's deferred steps are written if and only if the completion was (its UPDATE holds the run row, on the same lease token), with no fence of their own (a lock on the run row and its WAL record each, 15 % of a group's execution); the others are fenced once per row, as in hot_deferred_fenced (after the test that leaves the completions' out: OFFSET 0 keeps the planner from evaluating the fence first).
fdv AS MATERIALIZED (
    SELECT dv.* FROM dv JOIN c ON c.id = dv.run_id AND c.token = dv.token
    UNION ALL
    SELECT * FROM (
        SELECT * FROM dv
        WHERE NOT EXISTS (SELECT 1 FROM cv WHERE cv.run_id = dv.run_id AND cv.token = dv.token)
        OFFSET 0
    ) AS alone WHERE {fence}
)

-- hot_starts_columns --
-- A step start's row (`sv`).
run_id uuid, name text, kind text, status text, attempt int, run_pass int, output jsonb, error jsonb, worker_id text, token uuid, wake_at timestamptz, started_at timestamptz, finished_at timestamptz

-- hot_starts --
-- Step starts (CTE `i`): a step's attempt, inserted while the attempt holds its run and no cancel is requested.
INSERT INTO tasks_engine_stepattempt (run_id, name, kind, status, attempt, run_pass,
    counted, output, error, worker_id, lease_token, wake_at, started_at, finished_at)
SELECT sv.run_id, sv.name, sv.kind, sv.status, sv.attempt, sv.run_pass, TRUE, sv.output,
    sv.error, sv.worker_id, sv.token, sv.wake_at, sv.started_at, sv.finished_at
FROM sv
WHERE {fence}
RETURNING id, run_id, lease_token

-- hot_completes_columns --
-- A run completion's row (`cv`).
run_id uuid, token uuid, output jsonb, unreached jsonb, at timestamptz, progress jsonb

-- hot_completes --
-- Run completions (CTE `c`), each if its attempt still holds the run (the row it replaces is the fence). {lookup} as in hot_deferred; {after} references the write's other fenced parts, so their fences lock the run rows before this statement replaces them (a group's deferred completions come after it instead: hot_deferred_gated). A cancel that committed before this write (after the handler's last look at it) wins: the run ends canceled, without the output; one that waits for this write's row lock finds the run completed and answers False.
UPDATE tasks_engine_workflowrun r
SET status = CASE WHEN r.cancel_requested_at IS NULL THEN 'completed' ELSE 'canceled' END,
    output = CASE WHEN r.cancel_requested_at IS NULL THEN cv.output END,
    unreached_steps = cv.unreached,
    finished_at = cv.at, updated_at = cv.at, lease_token = NULL, available_at = NULL,
    waiting_on = '', error = NULL, progress = COALESCE(cv.progress, r.progress)
FROM cv
WHERE {lookup}r.id = cv.run_id AND r.lease_token = cv.token{after}
RETURNING r.id, cv.token, r.status

-- hot_started --
-- What a group's starts got: ('i', step id, lease token, run id{pad}).
SELECT 'i', i.id, i.lease_token, i.run_id{pad} FROM i

-- hot_completed --
-- What a group's run completions got: ('c', 1 if a cancel that committed first made it canceled else NULL, lease token, run id{pad}).
SELECT 'c', CASE WHEN c.status = 'canceled' THEN 1 END::bigint, c.token, c.id{pad} FROM c

-- hot_deferred_written --
-- The deferred completions written, now or before (a second send is harmless): ('d', step id, lease token, run id{pad}).
SELECT 'd', d.id, d.token, d.run_id{pad} FROM d
UNION ALL SELECT 'd', s.id, s.lease_token, s.run_id{pad}
    FROM tasks_engine_stepattempt s JOIN dv ON s.id = dv.step_id AND s.lease_token = dv.token
    WHERE s.id = ANY(ARRAY(SELECT step_id FROM dv)) AND s.status = 'completed'

-- claim_sources --
-- The runs a claim may take: expired leases first, then due timers, then pending by priority; each source reads its own partial index, so far-future sleepers and finished rows cost nothing. `not_these` (the runs the worker holds, and those the same statement writes) stay out of the expired source. {filters}: the worker's (name, version) pairs and queues; {paused}: the paused queues left out of due timers and pending runs (`claim_filter_paused`; empty while none is paused); {floor}: on partitioned tables, `claim_filter_floor` (older periods are never read), else empty. An expired lease is a running run: it goes on.
expired AS (
    SELECT id, 0 AS src, priority, available_at FROM tasks_engine_workflowrun
    WHERE status = 'running' AND available_at <= %(now)s{filters}{floor}
      AND id NOT IN (SELECT json_array_elements_text(%(not_these)s::json)::uuid)
    ORDER BY available_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), woken AS (
    SELECT id, 1 AS src, priority, available_at FROM tasks_engine_workflowrun
    WHERE status = 'waiting' AND available_at <= %(now)s AND concurrency_key IS NULL
      AND rate_key IS NULL{filters}{paused}{floor}
    ORDER BY available_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), due AS (
    SELECT id, 2 AS src, priority, available_at FROM tasks_engine_workflowrun
    WHERE status = 'pending' AND available_at <= %(now)s AND concurrency_key IS NULL
      AND rate_key IS NULL{filters}{paused}{floor}
    ORDER BY priority DESC, available_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)

-- claim_take --
-- The claim's update of the runs it takes from `claim_sources`, returning {columns}: the statement itself for a plain claim, CTE `k` of a group that claims along (transitions/hot_sql.py). {floor}: as in claim_sources (the update's own scan of the partitions is pruned too).
UPDATE tasks_engine_workflowrun SET status = 'running', lease_token = gen_random_uuid(),
    worker_id = %(worker_id)s, attempts = attempts + 1,
    due_at = CASE WHEN status = 'running' AND due_at > available_at THEN due_at ELSE available_at END,
    available_at = %(lease_until)s, waiting_on = '', started_at = COALESCE(started_at, %(now)s),
    updated_at = %(now)s
WHERE id IN (
    SELECT id FROM (
        SELECT * FROM expired UNION ALL SELECT * FROM woken UNION ALL SELECT * FROM due
    ) AS candidates ORDER BY src, priority DESC, available_at LIMIT %(limit)s
){floor}
RETURNING {columns}

-- claim_prestart --
-- The claim's start of each fresh run's first step, as this worker guessed it (transitions/first_steps.py), in CTE `ks` after the claim's `k`: the attempt StepBase._start would insert, written in the claim's commit. Only a run's first claim, with no step recorded, no cancel requested (the start fence's condition; the claim holds the row) and its deadline not passed. %(first_steps)s: {"name@version": step name}.
ks AS (
    INSERT INTO tasks_engine_stepattempt (run_id, name, kind, status, attempt, run_pass,
        counted, worker_id, lease_token, started_at)
    SELECT k.id, f.value, 'function', 'running', 1, 1, TRUE, k.worker_id, k.lease_token,
        %(now)s
    FROM k JOIN json_each_text(%(first_steps)s::json) AS f
        ON f.key = k.task_name || '@' || k.version
    WHERE k.attempts = 1 AND k.failures = 0 AND k.pass_offset = 0
      AND k.cancel_requested_at IS NULL AND (k.deadline_at IS NULL OR k.deadline_at > %(now)s)
      AND NOT EXISTS (SELECT 1 FROM tasks_engine_stepattempt s WHERE s.run_id = k.id)
    ON CONFLICT DO NOTHING
    RETURNING run_id, id
)

-- claim_filter_tasks --
-- Only the (name, version) pairs the worker registered, as one text[] parameter.
AND task_name || '@' || version = ANY(%(task_keys)s::text[])

-- claim_filter_queues --
-- Only the worker's queues, as one text[] parameter.
AND queue = ANY(%(queues)s::text[])

-- claim_filter_floor --
-- Partitioned tables only: no run older than the claim floor (transitions/claim_floor.py), so the periods below it are pruned from the plan.
AND id >= %(floor)s

-- claim_filter_paused --
-- None of the paused queues (transitions/queue_state.py), as one text[] parameter.
AND queue <> ALL(%(paused)s::text[])

-- renew_leases --
-- Extend every lease a worker holds (one JSON row per run and lease token); runs missing from the result are lost. A stale lease of a run whose fresh lease the same worker holds does not match. A row another transaction has locked (a fenced commit inside the holder's own atomic step keeps it locked until that step commits) is not waited for: it comes back with renewed = false if its committed token is still the lease's (no claim can take a locked row meanwhile), so one long transaction never holds up every other renewal.
WITH l AS (
    SELECT * FROM json_to_recordset(%(leases)s::json) AS t (run_id uuid, token uuid)
), free AS (
    SELECT id FROM tasks_engine_workflowrun
    WHERE id = ANY(ARRAY(SELECT run_id FROM l))
    FOR NO KEY UPDATE SKIP LOCKED
), renewed AS (
    UPDATE tasks_engine_workflowrun r SET available_at = %(until)s
    FROM l
    WHERE r.id IN (SELECT id FROM free) AND r.id = l.run_id AND r.lease_token = l.token
    RETURNING r.id, r.lease_token, r.cancel_requested_at, r.deadline_at, true AS renewed
)
SELECT * FROM renewed
UNION ALL
SELECT r.id, r.lease_token, r.cancel_requested_at, r.deadline_at, false
FROM tasks_engine_workflowrun r JOIN l ON r.id = l.run_id AND r.lease_token = l.token
WHERE r.id = ANY(ARRAY(SELECT run_id FROM l)) AND r.id NOT IN (SELECT id FROM free)

-- flow_any_keyed --
-- Whether a keyed run is pending, or waiting with a due timer (both on partial indexes).
SELECT 1 FROM tasks_engine_workflowrun WHERE status = 'pending' AND concurrency_key IS NOT NULL
UNION ALL SELECT 1 FROM tasks_engine_workflowrun
WHERE status = 'waiting' AND available_at <= %(now)s AND concurrency_key IS NOT NULL LIMIT 1

-- retry_runs --
-- Failed or canceled -> pending, due now, for a batch whose rows the caller locked (transitions/retry.py): each row's pass offset and retry history from %(rows)s, the rest alike.
UPDATE tasks_engine_workflowrun AS r
SET status = 'pending', available_at = %(now)s, updated_at = %(now)s,
    pass_offset = v.pass_offset, failures = 0, error = NULL, output = NULL, finished_at = NULL,
    cancel_requested_at = NULL, cancel_reason = '', waiting_on = '', worker_id = '',
    unreached_steps = '[]', awaited = %(awaited)s, retries = v.retries
FROM json_to_recordset(%(rows)s::json) AS v(id uuid, pass_offset integer, retries jsonb)
WHERE r.id = v.id

-- debounce_extend --
-- A debounce key's queued run (run_debounce_key_unique's row) takes an enqueue's input and becomes due %(due)s, or its debounce_until if that is sooner; only while it is still queued (a claimed run is the last window's: the enqueue inserts the next one).
UPDATE tasks_engine_workflowrun
SET input = %(input)s::jsonb, input_hash = %(input_hash)s, version = %(version)s,
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

-- flow_queue_running --
-- Running runs of a queue (the rate claim's count of a limited queue, as SQLite's guarded claim counts it: flow_claims.queue_room).
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
