-- 0004_history_fields.sql: the fields of a history event beyond its columns (the CLI's
-- notes say who did what), as text values.
ALTER TABLE {schema}.history ADD COLUMN extra jsonb;
