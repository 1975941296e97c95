"""A PostgreSQL store: the lease, the claims and the history on the database alone.

``leaderbeat_store_url = "postgresql://..."`` chooses it (``store/open.py`` opens it);
:func:`~.store.open_store` builds one on a connection string directly, for tests and
benchmarks. ``docs/postgresql.md`` describes the schema and how each rule of the Lua
scripts maps to SQL.

- :mod:`.schema`: the tables, created and migrated by the store (``ensure_schema``);
- :mod:`.pool`: the connection pool and the errors a failed call raises;
- :mod:`.lease_sql`: acquire, renew, release, holder: one statement each;
- :mod:`.rules`: the claim rules item by item, pure;
- :mod:`.claims_sql`: a chunk's claim in one transaction (fence, read, decide, write);
- :mod:`.state_sql`: last slots, fingerprints, history, pauses, nodes;
- :mod:`.store`: the thin adapter to the store seam.
"""
