-- 0009_grants_written.sql: a chunk's grants checked on the server, so that the claim's
-- COMMIT travels with its writes (two round trips, not three). A chunk's grant statement
-- passes it how many of its grants were written and how many it asked for; any fewer
-- (a slot granted to another claimant meanwhile) raises SQLSTATE LB001, which aborts
-- the transaction before its COMMIT: nothing of the chunk is written.
CREATE FUNCTION {schema}.grants_written(written bigint, wanted bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF written <> wanted THEN
        RAISE EXCEPTION 'of % slots, % were granted to another claimant meanwhile',
            wanted, wanted - written USING ERRCODE = 'LB001';
    END IF;
    RETURN written;
END
$$;

