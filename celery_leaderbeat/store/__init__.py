"""The Redis store: connection, keys, Lua scripts, the lease, the slot ledger, stored entries."""
