-- The cycle function's generic plans are costed for an unknown LIMIT (a
-- tenth of the queue): with 100,000 queued jobs the claim's estimate
-- passed jit_above_cost, and Postgres compiled 83 functions at every call
-- (67 ms of JIT for a claim of 8 that takes under 1 ms; `jobdeck bench
-- --scale --explain`). Its statements touch a few rows each: no JIT.
ALTER FUNCTION jobdeck_cycle(BIGINT[], BIGINT[], TEXT, TEXT[], BIGINT, BIGINT, BIGINT,
                             TEXT[], BIGINT[], TEXT[], BIGINT[])
    SET jit = off;
