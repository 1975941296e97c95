-- 0008_guard.sql: the worker guard's records. Times are the server's (clock_timestamp());
-- a row whose time has passed counts as absent, as a Redis key past its ttl would.
-- guard_runs: one row per run (a slot's task id, '~<k>' added for retry k): its record
--   (state s started / f finished, the token it started under, its worker) kept until
--   record_until, and its liveness (token and worker) until alive_until (NULL: none).
CREATE TABLE {schema}.guard_runs (
    app text NOT NULL,
    run_id text NOT NULL,
    state char(1),
    token bigint,
    worker text,
    record_until timestamptz,
    alive_token bigint,
    alive_worker text,
    alive_until timestamptz,
    PRIMARY KEY (app, run_id)
);
CREATE INDEX guard_runs_age ON {schema}.guard_runs (app, record_until);
-- guard_fence: per app, the last run token handed out (never below the server's clock
-- in microseconds, so it keeps rising after the rows were lost).
CREATE TABLE {schema}.guard_fence (
    app text PRIMARY KEY,
    fence bigint NOT NULL
);
-- guard_locks: one row per entry with an overlap policy; the row every call about the
-- entry locks first. holder: the task id of the run going on, or of the waiting slot
-- handed the turn, until lock_until. held_*: the holder's slot and worker (cancelled: a
-- newer slot replaced it) until held_until. waiting_until: when the entry's waiting
-- slots lapse (each slot that starts to wait puts it off).
CREATE TABLE {schema}.guard_locks (
    app text NOT NULL,
    entry text NOT NULL,
    holder text,
    lock_until timestamptz,
    held_slot_ms bigint,
    held_worker text,
    held_cancelled boolean NOT NULL DEFAULT false,
    held_until timestamptz,
    waiting_until timestamptz,
    PRIMARY KEY (app, entry)
);
-- guard_waiting: the slots waiting for their entry's run, and the message that starts each.
CREATE TABLE {schema}.guard_waiting (
    app text NOT NULL,
    entry text NOT NULL,
    task_id text NOT NULL,
    slot_ms bigint NOT NULL,
    message text NOT NULL,
    PRIMARY KEY (app, entry, task_id)
);
CREATE INDEX guard_waiting_order ON {schema}.guard_waiting (app, entry, slot_ms, task_id);
-- guard_decisions: how often the guard decided each (entry, policy, decision).
CREATE TABLE {schema}.guard_decisions (
    app text NOT NULL,
    entry text NOT NULL,
    policy text NOT NULL,
    decision text NOT NULL,
    n bigint NOT NULL,
    PRIMARY KEY (app, entry, policy, decision)
);
