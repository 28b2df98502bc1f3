-- The reaper finds expired leases among the leased and running jobs
-- through jobs_state (state, id), whose entries for those two states are
-- the few jobs held by workers, and checks their expiry on the row: at a
-- million finished and 100,000 queued jobs with 100 running, 8 buffers
-- and 0.08 ms. The index on lease expiry served nothing else, and every
-- claim wrote an entry into it: without it the server runs the engine's
-- common cycle statement in 2.7 % fewer instructions
-- (bench/server_instructions.sh; bench/HISTORY.md, session 20).
DROP INDEX jobs_lease_expiry;
