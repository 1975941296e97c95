-- 0006_loss_reports.sql: a loss of writes one node saw, made known to every node.
-- lease.loss_generation: the highest generation a node saw before the database lost
--   writes; until a leader starts again past it, leaders' and rescuers' claims refuse
-- lost_reports: per entry and node, the newest slot the node knew settled before the
--   loss (what the leader's margin starts from), kept for a few lease ttls
ALTER TABLE {schema}.lease ADD COLUMN loss_generation bigint;
CREATE TABLE {schema}.lost_reports (
    app text NOT NULL,
    entry text NOT NULL,
    node text NOT NULL,
    slot_ms bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (app, entry, node)
);
