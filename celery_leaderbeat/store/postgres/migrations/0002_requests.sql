-- 0002_requests.sql: the CLI's requests for the leader, and what backfills sent.

-- Pending requests, taken in ``position`` order; one put back goes first in line (a
-- position below every pending one).
CREATE TABLE {schema}.requests (
    app text NOT NULL,
    position bigint NOT NULL,
    body text NOT NULL,
    queued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (app, position)
);
CREATE SEQUENCE {schema}.request_positions;

-- The backfill request that sent each slot: the key refuses a second backfill of it.
CREATE TABLE {schema}.backfilled (
    app text NOT NULL,
    entry text NOT NULL,
    slot_ms bigint NOT NULL,
    request_id text NOT NULL,
    PRIMARY KEY (app, entry, slot_ms)
);
