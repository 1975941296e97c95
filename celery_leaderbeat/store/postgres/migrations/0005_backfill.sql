-- 0005_backfill.sql: what a backfill's claim decides from.
-- history_whole_ms: the history holds every event written after this (ms): the time of
--   the newest row pruned (NULL: none pruned yet; then from its oldest row on)
-- backfill_floor_ms: no backfill reaches a slot before this (set when a leader starts
--   again after the database lost writes: what was sent before it cannot be told)
-- lost_at_ms: the server's time when a leader last started again after a loss
ALTER TABLE {schema}.lease ADD COLUMN history_whole_ms bigint;
ALTER TABLE {schema}.lease ADD COLUMN backfill_floor_ms bigint;
ALTER TABLE {schema}.lease ADD COLUMN lost_at_ms bigint;
CREATE INDEX history_sent ON {schema}.history (app, entry, slot_ms) WHERE event = 'sent';
