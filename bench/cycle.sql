-- One call of jobdeck_cycle as the engine makes it: finish the jobs the
-- previous call of this client started (their ids and lease tokens carried
-- over in pgbench variables), claim and start up to :batch more. Run by
-- bench/cycle.sh through pgbench -M prepared; :ids and :toks start as '{}'.
SELECT coalesce(array_agg(id) FILTER (WHERE state = 'running'), '{}') AS ids,
       coalesce(array_agg(lease_token) FILTER (WHERE state = 'running'), '{}') AS toks
FROM jobdeck_cycle(:ids::bigint[], :toks::bigint[], 'cycle-' || :client_id, ARRAY['bench'],
                   :win, :batch, 30000, ARRAY['bench'], ARRAY[30000]::bigint[],
                   ARRAY['hold'], ARRAY[0]::bigint[])
\gset
