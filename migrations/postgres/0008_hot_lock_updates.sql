-- A lock row changes holder twice per targeted job (taken at its start,
-- freed at its finish). With an index on holder_job neither change could
-- be a HOT update: each wrote a new entry in locks_pkey and locks_held,
-- and every later probe of the target walked past the dead ones until a
-- vacuum (200 jobs per target left 400 entries per key in the benchmark).
-- Without it both are HOT: the row's versions stay on its page, pruned in
-- place, and the key's index entry stays one. locks_held served only the
-- Locks pane, which now reads the table: one row per target ever locked.
DROP INDEX locks_held;
