-- 0003_generation.sql: a counter every write call raises, per app. A node remembers the
-- highest it has seen: the server answering a lower one holds older state than the node
-- saw (a replica promoted that had not received every commit, a backup restored).
ALTER TABLE {schema}.lease ADD COLUMN generation bigint NOT NULL DEFAULT 0;
