// pg-boss 12 through its public API: bulk insert() N no-op jobs into a
// queue created with notify: true (instance useListenNotify: true), work()
// with localConcurrency C (C polling workers, pg-boss's concurrency knob),
// each fetching batches of 10 in burst mode (burstWhenBatchFull: fetch again
// at once while batches come back full; one worker with batchSize C managed
// only about half the rate here),
// until pg-boss shows them all completed; then add->start latency with jobs
// sent one at a time. All else is pg-boss's defaults.
import { PgBoss } from 'pg-boss';
import { args, onStart, waitStarted, waitFor, latencyPhase, report } from './common.mjs';

const a = args();
const boss = new PgBoss({ connectionString: a.url, useListenNotify: true });
boss.on('error', (e) => console.error('pg-boss:', e.message));
await boss.start();
await boss.createQueue('noop', { notify: true });

const t0 = performance.now();
for (let i = 0; i < a.jobs; i += 5000) {
  const n = Math.min(5000, a.jobs - i);
  await boss.insert('noop', Array.from({ length: n }, () => ({ data: { stamp: 0 } })));
}
const enqueueS = (performance.now() - t0) / 1000;

const t1 = performance.now();
await boss.work('noop', { localConcurrency: a.concurrency, batchSize: 10, burstWhenBatchFull: true }, async (jobs) => {
  for (const j of jobs) onStart(j.data.stamp);
});
await waitStarted(a.jobs);
const db = boss.getDb();
const completed = async () => {
  const r = await db.executeSql("SELECT count(*)::int AS n FROM pgboss.job WHERE name = 'noop' AND state = 'completed'");
  return r.rows[0].n >= a.jobs;
};
await waitFor(completed);
const processS = (performance.now() - t1) / 1000;

const lat = await latencyPhase(a.latencyJobs, (stamp) => boss.send('noop', { stamp }));
report('pgboss-postgres', a, enqueueS, processS, lat);
await boss.stop({ graceful: false, wait: false }).catch(() => {});
process.exit(0);
