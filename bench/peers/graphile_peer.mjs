// graphile-worker 0.18 through its public API (needs Node 22, from the npm
// package node@22): workerUtils.addJobs() N no-op jobs, run() with
// concurrency C and all else default (LISTEN/NOTIFY wake-ups, 2 s poll
// backstop, local queue off) until the jobs table is empty (graphile-worker
// deletes a job when it succeeds); then add->start latency with addJob one
// at a time.
import { run, makeWorkerUtils, Logger } from 'graphile-worker';
import pg from 'pg';
import { args, onStart, waitStarted, waitFor, latencyPhase, report } from './common.mjs';

const a = args();
const quiet = new Logger(() => () => {});
const utils = await makeWorkerUtils({ connectionString: a.url, logger: quiet });
await utils.migrate();

const t0 = performance.now();
for (let i = 0; i < a.jobs; i += 5000) {
  const n = Math.min(5000, a.jobs - i);
  await utils.addJobs(Array.from({ length: n }, () => ({ identifier: 'noop', payload: { stamp: 0 } })));
}
const enqueueS = (performance.now() - t0) / 1000;

const t1 = performance.now();
const runner = await run({
  connectionString: a.url,
  concurrency: a.concurrency,
  noHandleSignals: true,
  // Its default logger prints a line per job, which would be timed too.
  logger: quiet,
  taskList: { noop: async (payload) => onStart(payload.stamp) },
});
await waitStarted(a.jobs);
const client = new pg.Client({ connectionString: a.url });
await client.connect();
await waitFor(async () => {
  const r = await client.query('SELECT count(*)::int AS n FROM graphile_worker._private_jobs');
  return r.rows[0].n === 0;
});
const processS = (performance.now() - t1) / 1000;

const lat = await latencyPhase(a.latencyJobs, (stamp) => utils.addJob('noop', { stamp }));
report('graphile-postgres', a, enqueueS, processS, lat);
await Promise.race([runner.stop(), new Promise((r) => setTimeout(r, 5000))]).catch(() => {});
process.exit(0);
