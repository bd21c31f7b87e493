#!/usr/bin/env python3
# split_schema.py: a measurement for a design decision of issue 26, not
# part of `make bench` (bench/README.md "A dispatch table apart from the
# log: the SQL ceiling"). Needs Debian's python3 (its sqlite3 module is
# the same SQLite library the store links); `make deps` does not install
# it. Run: python3 bench/split_schema.py [EVENTS]
#
# The same claim + complete loop, in plain SQL through prepared statements
# (executemany), on two schemas of one SQLite file (WAL; claims committed
# with synchronous=NORMAL, completions with FULL, as the store does):
#   current  the store's events table (schema 10) with its queue indexes:
#            a claim and a completion each rewrite the event row;
#   inplace  schema 11 (docs/sqlite.md "Claims in place"): the same table,
#            a claim writes its due time to claim_due and moves the row in
#            the two indexes ordered by due time across sessions only;
#   split    the same events table holding the log (rows appended settled,
#            out of every queue index), a `queue` table of small rows
#            (position, session, index, type, due time, claim fields) with
#            two indexes, and a `done` table: a claim updates the small
#            row, a completion deletes it and appends the processed record;
#   split4   the split with the four queue orders the store answers (by due
#            time, by session and index, by type and due time, by session
#            and due time), not two: what a split store would have to keep;
#   memq     schema 11's table without the four queue orders: the SQL left
#            if the queues were held in memory (claims and completions by
#            position, the positions known without a query). DROP
#            (environment) names which of the four it drops (default: all);
#            NOCLAIM=1 writes no claim to the file either (claims that
#            would live in memory only).
# Batches of B (256, or the environment's B) over 100 sessions, as the
# engine's claims and completions. MODES (environment) picks the schemas.
import os, random, sqlite3, sys, tempfile, time

def fresh(path):
    for x in ("", "-wal", "-shm"):
        try: os.remove(path + x)
        except FileNotFoundError: pass
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("pragma journal_mode=wal"); db.execute("pragma synchronous=full")
    return db
PAY = '{"customer":"c-000123","items":[{"qty":2,"sku":"SKU-42"}],"note":"leave at the door"}'
INPLACE_DUE = "coalesce(claim_due, due_at)"
def cur_schema(db, inplace=False, id_type="text"):
    # the store's events table and its queue indexes (as of schema v10; v11
    # with inplace); bench/sqlite_ids.py takes it with id_type "blob"
    script = """
    create table events(position integer primary key, session text not null, idx integer not null, id %s not null unique,
      type text, payload text, lane text, created_at integer, cause_index integer, cause_attempt integer, not_before integer,
      status integer not null, attempts integer, failures integer, last_error text, processed_at integer, claim_holder text,
      claim_expires_at integer, retry_at integer, queued integer not null, due_at integer, last_failed_attempt integer,
      returned integer, origin_session text, origin_index integer, first_claimed_at integer, last_claimed_at integer,
      failed_at integer, processed_by_attempt integer, key text, revision integer not null default 1, meta text, unique(session, idx));
    create index events_queued on events(due_at, position) where queued = 1;
    create index events_session_queued on events(session, idx, due_at) where queued = 1;
    create index events_lane on events(session, lane, idx) where lane is not null and status <> 1;
    create index events_dead on events(position) where status = 2;
    create index events_session_dead on events(session, position) where status = 2;
    create index events_session_due on events(session, due_at) where queued = 1;
    create index events_type_pending on events(type, queued, due_at, position) where status = 0;
    """
    script = script.replace("id %s not", "id %s not" % id_type)
    if inplace:
        script = script.replace("key text, revision", "key text, claim_due integer, revision")
        script = script.replace("on events(due_at, position)", "on events(%s, position)" % INPLACE_DUE)
        script = script.replace("on events(type, queued, due_at, position)", "on events(type, queued, %s, position)" % INPLACE_DUE)
    db.executescript(script)
def fill(db, split):
    db.execute("begin")
    rows = []
    for p in range(1, N + 1):
        s = "sess-%03d" % (p % 100); i = p // 100 + 1
        rows.append((p, s, i, "%032x" % random.getrandbits(128), "job", PAY, p, 0 if not split else 0, 1, p))
    if split:
        db.executemany("insert into events(position, session, idx, id, type, payload, created_at, status, queued, due_at) values (?,?,?,?,?,?,?,?,0,NULL)", [r[:8] for r in rows])
        db.executemany("insert into queue(position, session, idx, type, due_at) values (?,?,?,?,?)", [(r[0], r[1], r[2], r[4], r[9]) for r in rows])
    else:
        db.executemany("insert into events(position, session, idx, id, type, payload, created_at, status, queued, due_at) values (?,?,?,?,?,?,?,?,?,?)", rows)
    db.execute("commit")
def split_schema(db, four=False):
    cur_schema(db)
    db.executescript("""
    create table queue(position integer primary key, session text not null, idx integer not null, type text,
      due_at integer, claim_due integer, attempts integer default 0, claim_holder text, claim_expires_at integer,
      first_claimed_at integer);
    create index queue_due on queue(due_at, position);
    create index queue_session on queue(session, idx);
""" + ("""
    drop index queue_due;
    create index queue_due on queue(coalesce(claim_due, due_at), position);
    create index queue_type on queue(type, coalesce(claim_due, due_at), position);
    create index queue_session_due on queue(session, due_at);
""" if four else "") + """
    create table done(position integer primary key, processed_at integer, attempts integer, first_claimed_at integer,
      last_claimed_at integer, returned integer);
    """)
def run(mode):
    split, inplace = mode.startswith("split"), mode == "inplace"
    db = fresh(PATH)
    if split: split_schema(db, mode == "split4")
    else: cur_schema(db, inplace or mode == "memq")
    if mode == "memq":
        for ix in os.environ.get("DROP", "events_queued events_session_queued events_session_due events_type_pending").split():
            db.execute("drop index " + ix)
        pending = list(range(1, N + 1))
    fill(db, split)
    now = N + 10; done = 0; t = time.perf_counter()
    while done < N:
        db.execute("pragma synchronous=normal"); db.execute("begin immediate")
        if mode == "split4":  # claims in place, as schema 11: the per-session orders do not move
            ps = [r[0] for r in db.execute("select position from queue where coalesce(claim_due, due_at) <= ? order by coalesce(claim_due, due_at), position limit ?", (now, B))]
            db.executemany("update queue set claim_due = ?, attempts = attempts + 1, claim_holder = 'h', claim_expires_at = ?, first_claimed_at = ? where position = ?",
                           [(now + 10**9, now + 10**9, now, p) for p in ps])
        elif split:
            ps = [r[0] for r in db.execute("select position from queue where due_at <= ? order by due_at, position limit ?", (now, B))]
            db.executemany("update queue set due_at = ?, attempts = attempts + 1, claim_holder = 'h', claim_expires_at = ?, first_claimed_at = ? where position = ?",
                           [(now + 10**9, now + 10**9, now, p) for p in ps])
        elif mode == "memq":
            ps, pending = pending[:B], pending[B:]
            if not os.environ.get("NOCLAIM"): db.executemany("update events set attempts = 1, failures = 0, last_error = NULL, processed_at = NULL, claim_holder = 'h', claim_expires_at = ?, retry_at = NULL, claim_due = ?, last_failed_attempt = NULL, returned = NULL, first_claimed_at = ?, last_claimed_at = ?, failed_at = NULL, processed_by_attempt = NULL where position = ? and queued = 1 and status = 0 and due_at <= ?",
                           [(now + 10**9, now + 10**9, now, now, p, now + 10**9) for p in ps])
        elif inplace:
            ps = [r[0] for r in db.execute("select position from events indexed by events_queued where queued = 1 and %s <= ? order by %s, position limit ?" % (INPLACE_DUE, INPLACE_DUE), (now, B))]
            db.executemany("update events set attempts = 1, failures = 0, last_error = NULL, processed_at = NULL, claim_holder = 'h', claim_expires_at = ?, retry_at = NULL, claim_due = ?, last_failed_attempt = NULL, returned = NULL, first_claimed_at = ?, last_claimed_at = ?, failed_at = NULL, processed_by_attempt = NULL where position = ? and queued = 1 and status = 0 and due_at <= ?",
                           [(now + 10**9, now + 10**9, now, now, p, now + 10**9) for p in ps])
        else:
            ps = [r[0] for r in db.execute("select position from events indexed by events_queued where queued = 1 and due_at <= ? order by due_at, position limit ?", (now, B))]
            db.executemany("update events set status = 0, attempts = 1, failures = 0, last_error = NULL, processed_at = NULL, claim_holder = 'h', claim_expires_at = ?, retry_at = NULL, queued = 1, due_at = ?, last_failed_attempt = NULL, returned = NULL, first_claimed_at = ?, last_claimed_at = ?, failed_at = NULL, processed_by_attempt = NULL where position = ?",
                           [(now + 10**9, now + 10**9, now, now, p) for p in ps])
        db.execute("commit"); db.execute("pragma synchronous=full"); db.execute("begin immediate")
        if split:
            db.executemany("delete from queue where position = ?", [(p,) for p in ps])
            db.executemany("insert into done(position, processed_at, attempts, first_claimed_at, last_claimed_at, returned) values (?,?,1,?,?,0)", [(p, now, now, now) for p in ps])
        else:
            db.executemany("update events set status = 1, attempts = 1, failures = 0, last_error = NULL, processed_at = ?, claim_holder = NULL, claim_expires_at = NULL, retry_at = NULL, queued = 0, due_at = NULL, last_failed_attempt = NULL, returned = 0, first_claimed_at = ?, last_claimed_at = ?, failed_at = NULL, processed_by_attempt = 1" + (", claim_due = NULL" if inplace or mode == "memq" else "") + " where position = ?",
                           [(now, now, now, p) for p in ps])
        db.execute("commit")
        done += len(ps)
    d = time.perf_counter() - t
    db.close()
    return N / d
if __name__ == "__main__":  # bench/sqlite_ids.py imports cur_schema alone
    N = int(sys.argv[1]) if len(sys.argv) > 1 else 60000
    B = int(os.environ.get("B", "256"))
    MODES = os.environ.get("MODES", "current inplace split split4 memq").split()
    PATH = os.path.join(tempfile.mkdtemp(), "split.db")
    for r in range(2):  # alternating rounds: compare within a round
        for mode in MODES:
            print("round %d %-8s %.0f events/s" % (r + 1, mode, run(mode)))
    fresh(PATH).close()
    os.remove(PATH)
    os.rmdir(os.path.dirname(PATH))
