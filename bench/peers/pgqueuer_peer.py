"""pgqueuer through its public API: bulk-enqueue N no-op jobs, run one
QueueManager with pgqueuer's defaults (batch_size 10, no concurrency cap:
max_concurrent_tasks must be at least twice the batch size, and an
entrypoint concurrency_limit of 8 is counted in SQL against completions that
pgqueuer flushes lazily, which throttles it to under 100 jobs/s; --concurrency
is therefore reported but not applied) until
the queue table is empty (pgqueuer deletes a job once its completion is
flushed), then add jobs one at a time into the idle worker for add->start
latency. Prints one JSON line in the shape of `jobdeck bench --json`."""

import argparse
import asyncio
import json
import time

import asyncpg
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.models import Job

started = 0
latencies_ms: list[float] = []


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def wait_started(n, limit=900.0, run=None):
    t = time.monotonic()
    while started < n:
        if run is not None and run.done():
            raise SystemExit(f"pgqueuer_peer: worker stopped: {run.exception()!r}")
        if time.monotonic() - t > limit:
            raise SystemExit(f"pgqueuer_peer: timeout, {started} of {n} jobs started")
        await asyncio.sleep(0.0005)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--latency-jobs", type=int, default=200)
    a = ap.parse_args()

    setup = await asyncpg.connect(a.url)
    await Queries(AsyncpgDriver(setup)).install()
    worker_conn = await asyncpg.connect(a.url)
    qm = QueueManager(Queries(AsyncpgDriver(worker_conn)))
    queries = Queries(AsyncpgDriver(setup))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        global started
        stamp = int(job.payload or b"0")
        if stamp:
            latencies_ms.append((time.time_ns() // 1000 - stamp) / 1000)
        started += 1

    t0 = time.monotonic()
    for i in range(0, a.jobs, 5000):
        n = min(5000, a.jobs - i)
        await queries.enqueue(["noop"] * n, [b"0"] * n, [0] * n)
    enqueue_s = time.monotonic() - t0

    t1 = time.monotonic()
    run = asyncio.create_task(qm.run())
    await wait_started(a.jobs, run=run)
    while await setup.fetchval("SELECT count(*) FROM pgqueuer") > 0:
        await asyncio.sleep(0.002)
    process_s = time.monotonic() - t1

    for _ in range(a.latency_jobs):
        before = started
        await queries.enqueue("noop", str(time.time_ns() // 1000).encode())
        await wait_started(before + 1, 30, run)
        await asyncio.sleep(0.02)

    qm.shutdown.set()
    try:
        await asyncio.wait_for(run, 10)
    except (asyncio.TimeoutError, Exception):
        pass
    lat = (
        {"p50": pct(latencies_ms, 50), "p95": pct(latencies_ms, 95), "p99": pct(latencies_ms, 99)}
        if latencies_ms
        else None
    )
    print(
        json.dumps(
            {
                "backend": "pgqueuer-postgres",
                "jobs": a.jobs,
                "slots": a.concurrency,
                "enqueue_per_s": a.jobs / enqueue_s,
                "process_per_s": a.jobs / process_s,
                "latency_ms": lat,
            }
        )
    )


asyncio.run(main())
