-- 0007_entries.sql: the entries defined at run time (the entry API, the CLI), versioned.
-- entries: one row per live entry; version: the app's version when it last changed;
--   anchor_ms: its slots are counted from here; kept: the anchor was given (an import)
-- entry_meta: per app, the version every change raises, and the floor: changes before
--   it are forgotten (a node that far behind reads every entry)
-- entries_removed: removed names and the version of their removal (capped)
CREATE TABLE {schema}.entries (
    app text NOT NULL,
    name text NOT NULL,
    version bigint NOT NULL,
    anchor_ms bigint NOT NULL,
    fingerprint text NOT NULL,
    timing text NOT NULL,
    enabled boolean NOT NULL,
    ran_ms bigint,
    kept boolean NOT NULL DEFAULT false,
    definition text NOT NULL,
    PRIMARY KEY (app, name)
);
CREATE INDEX entries_version ON {schema}.entries (app, version);
CREATE TABLE {schema}.entry_meta (
    app text PRIMARY KEY,
    version bigint NOT NULL DEFAULT 0,
    floor bigint NOT NULL DEFAULT 0
);
CREATE TABLE {schema}.entries_removed (
    app text NOT NULL,
    name text NOT NULL,
    version bigint NOT NULL,
    PRIMARY KEY (app, name)
);
CREATE INDEX entries_removed_version ON {schema}.entries_removed (app, version);
