-- 0001_initial.sql: the tables of every app in one schema ({schema}), keyed by app (the
-- Redis store's key prefix). Times are the server's: clock_timestamp(), or ms since the
-- epoch where a slot is compared with one (slots are ms everywhere else too).

-- The lease: one row per app. The epoch only rises: a release clears the holder and
-- keeps the epoch, so the next acquisition is above every epoch handed out.
CREATE TABLE {schema}.lease (
    app text PRIMARY KEY,
    holder text,                      -- NULL: nobody holds it (released)
    epoch bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    progress_at timestamptz,          -- the holder's latest claim: a rescue waits behind it
    defined_epoch bigint              -- the epoch of the leader that wrote its definitions
);

-- Each entry's last slot and its state: c claimed, s sent, k skipped, a anchor,
-- u unsent (reported). node is '' for a leader's claim, the standby's id for a rescue.
CREATE TABLE {schema}.slots (
    app text NOT NULL,
    entry text NOT NULL,
    slot_ms bigint NOT NULL,
    epoch bigint NOT NULL,
    state char(1) NOT NULL,
    node text NOT NULL DEFAULT '',
    claimed_ms bigint,
    PRIMARY KEY (app, entry)
);

-- Every slot granted to be sent, once: the unique key refuses a second grant of one
-- slot across epochs, whatever the slots row says. Kept longer than any catch-up window.
CREATE TABLE {schema}.grants (
    app text NOT NULL,
    entry text NOT NULL,
    slot_ms bigint NOT NULL,
    epoch bigint NOT NULL,
    node text NOT NULL DEFAULT '',
    recovered boolean NOT NULL DEFAULT false,
    granted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (app, entry, slot_ms)
);
CREATE INDEX grants_age ON {schema}.grants (app, granted_at);

-- Claimed, unconfirmed slots a newer claim of another claimant replaced: the next
-- leader reports them (and may recover them).
CREATE TABLE {schema}.overtaken (
    app text NOT NULL,
    entry text NOT NULL,
    slot_ms bigint NOT NULL,
    epoch bigint NOT NULL,
    state char(1) NOT NULL,
    node text NOT NULL DEFAULT '',
    claimed_ms bigint,
    PRIMARY KEY (app, entry, slot_ms)
);

-- The fingerprint of each entry's definition the leader plans ('-': no longer scheduled).
CREATE TABLE {schema}.definitions (
    app text NOT NULL,
    entry text NOT NULL,
    fingerprint text NOT NULL,
    PRIMARY KEY (app, entry)
);

CREATE TABLE {schema}.paused (
    app text NOT NULL,
    entry text NOT NULL,
    record jsonb NOT NULL DEFAULT '{{}}',
    PRIMARY KEY (app, entry)
);

-- The history: pruned to a count and an age per app.
CREATE TABLE {schema}.history (
    id bigserial PRIMARY KEY,
    app text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    event text NOT NULL,
    entry text NOT NULL DEFAULT '',
    slot_ms bigint,
    node text NOT NULL DEFAULT '',
    epoch bigint NOT NULL DEFAULT 0,
    detail text NOT NULL DEFAULT ''
);
CREATE INDEX history_app ON {schema}.history (app, id);

CREATE TABLE {schema}.nodes (
    app text NOT NULL,
    node text NOT NULL,
    record jsonb NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (app, node)
);
