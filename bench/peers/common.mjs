// What the Node harnesses share: arguments, the start counter, the
// one-at-a-time latency phase and the JSON line bench/run.sh reads.
import { parseArgs } from 'node:util';

export function args() {
  const { values } = parseArgs({
    options: {
      url: { type: 'string' },
      jobs: { type: 'string', default: '20000' },
      concurrency: { type: 'string', default: '8' },
      'latency-jobs': { type: 'string', default: '200' },
    },
  });
  if (!values.url) throw new Error('--url is required');
  return {
    url: values.url,
    jobs: Number(values.jobs),
    concurrency: Number(values.concurrency),
    latencyJobs: Number(values['latency-jobs']),
  };
}

export const state = { started: 0, latencies: [] };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export const nowUs = () => Number(process.hrtime.bigint() / 1000n) + epochOffsetUs;
// hrtime is monotonic; anchor it to the epoch once so stamps are comparable
// within this process without the coarser Date.now().
const epochOffsetUs = Date.now() * 1000 - Number(process.hrtime.bigint() / 1000n);

/** Called at the start of every handler; stamp is 0 for bulk jobs. */
export function onStart(stamp) {
  if (stamp) state.latencies.push((nowUs() - stamp) / 1000);
  state.started += 1;
}

export async function waitStarted(n, limitMs = 900_000) {
  const t = Date.now();
  while (state.started < n) {
    if (Date.now() - t > limitMs) throw new Error(`timeout: ${state.started} of ${n} jobs started`);
    await sleep(1);
  }
}

export async function waitFor(check, limitMs = 900_000) {
  const t = Date.now();
  while (!(await check())) {
    if (Date.now() - t > limitMs) throw new Error('timeout waiting for the queue to drain');
    await sleep(2);
  }
}

/** Adds jobs one at a time into idle workers; each waits for the previous start. */
export async function latencyPhase(n, enqueue) {
  state.latencies = [];
  for (let i = 0; i < n; i++) {
    const before = state.started;
    await enqueue(nowUs());
    await waitStarted(before + 1, 30_000);
    await sleep(20);
  }
  return state.latencies;
}

function pct(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.round((p / 100) * (sorted.length - 1)))];
}

export function report(backend, a, enqueueS, processS, lat) {
  const s = [...lat].sort((x, y) => x - y);
  const latency = s.length ? { p50: pct(s, 50), p95: pct(s, 95), p99: pct(s, 99) } : null;
  console.log(JSON.stringify({
    backend,
    jobs: a.jobs,
    slots: a.concurrency,
    enqueue_per_s: a.jobs / enqueueS,
    process_per_s: a.jobs / processS,
    latency_ms: latency,
  }));
}
