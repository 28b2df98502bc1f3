"""The SQLite reference: single-row UPDATE transactions in a loop on a WAL
database with synchronous=NORMAL (jobdeck's settings), one connection, for
--seconds. Prints one JSON line with the transactions per second."""

import argparse
import json
import os
import sqlite3
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--seconds", type=float, default=5.0)
a = ap.parse_args()

with tempfile.TemporaryDirectory() as d:
    db = sqlite3.connect(os.path.join(d, "ref.db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
    db.execute("INSERT INTO t VALUES (1, 0)")
    n = 0
    t0 = time.monotonic()
    end = t0 + a.seconds
    while time.monotonic() < end:
        for _ in range(100):
            db.execute("BEGIN IMMEDIATE")
            db.execute("UPDATE t SET n = n + 1 WHERE id = 1")
            db.execute("COMMIT")
        n += 100
    s = time.monotonic() - t0
    db.close()

print(json.dumps({"backend": "sqlite-wal-update", "process_per_s": n / s, "tx": n}))
