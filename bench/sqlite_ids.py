#!/usr/bin/env python3
# sqlite_ids.py: a measurement for issue 26, not part of `make bench`
# (bench/README.md "What the durable targets need", "Looked at and not
# built"). Needs Debian's python3, whose sqlite3 module is the SQLite
# library the store links. Run: python3 bench/sqlite_ids.py [EVENTS]
#
# Appends of settled events in batches of 100 (one transaction each, WAL,
# synchronous=NORMAL) into the store's events table (split_schema.py's, with
# every index: a settled event enters none of the queue ones), with the ids as their
# 36-character text (as the store keeps them) and as 16-byte blobs, in
# alternating rounds; prints events/s and the file's bytes per event. The
# ids are in time order, as the store's UUIDv7 ids are.
import os, shutil, sqlite3, sys, tempfile, time, uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from split_schema import cur_schema  # the store's events table and indexes

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
PAY = '{"customer":"c-000123","items":[{"qty":2,"sku":"SKU-42"}],"note":"leave at the door"}'
DIR = tempfile.mkdtemp()

def run(blob):
    path = os.path.join(DIR, "ids%d.db" % blob)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("pragma journal_mode=wal"); db.execute("pragma synchronous=normal")
    cur_schema(db, id_type="blob" if blob else "text")
    ms = int(time.time() * 1000)
    ids = []
    for i in range(N):
        u = uuid.UUID(int=(ms << 80) | i)
        ids.append(u.bytes if blob else str(u))
    t, pos = time.perf_counter(), 0
    for b in range(N // 100):
        db.execute("begin")
        db.executemany("insert into events(position, session, idx, id, type, payload, created_at, status, queued)"
                       " values (?,?,?,?,?,?,?,?,?)",
                       [(pos + k + 1, "s-%02d" % (b % 100), b // 100 * 100 + k + 1, ids[pos + k], "order.placed",
                         PAY, pos, 1, 0) for k in range(100)])
        db.execute("commit")
        pos += 100
    rate = pos / (time.perf_counter() - t)
    db.close()
    size = os.path.getsize(path)
    for x in ("", "-wal", "-shm"):
        if os.path.exists(path + x): os.remove(path + x)
    return rate, size / pos

for r in range(3):  # alternating rounds: compare within a round
    for blob in (0, 1):
        rate, per = run(blob)
        print("round %d ids as %-4s %.0f events/s, %.0f file bytes an event" % (r + 1, "blob" if blob else "text", rate, per))
shutil.rmtree(DIR)
