-- The engine's cycle runs in one round trip, `BEGIN IMMEDIATE` to `COMMIT`
-- (src/store/sqlite/cycle.rs), so it cannot read what it wrote before it
-- commits. Its last statement inserts a row here when a lock did not go
-- as its claim predicted: the constraint fails that statement, SQLite stops
-- the query before its `COMMIT`, and the transaction is rolled back. The
-- table stays empty.
CREATE TABLE cycle_checks (
    ok INTEGER NOT NULL CONSTRAINT cycle_locks_went_as_the_claim_predicted CHECK (ok = 1)
);
