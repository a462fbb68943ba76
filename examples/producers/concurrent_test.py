"""Run by migrate/emitfunc_test.go: producer.py's emit from 4 threads, each
with its own connection, on 2 aggregates. Each transaction, after its emit
(which holds the aggregate's lock), sleeps a little, then checks that every
committed event of its aggregate it can see has a smaller id than its own:
the events that committed before it. Prints the ids it wrote, one a line."""
import random
import sys
import threading
import time
import uuid

import psycopg

sys.path.insert(0, sys.path[0])
from producer import emit, place_order  # noqa: E402

conninfo, n = sys.argv[1], int(sys.argv[2])
aggs = [str(uuid.uuid4()), str(uuid.uuid4())]
out, failures, lock = [], [], threading.Lock()


def worker(w):
    rnd = random.Random(w)
    with psycopg.connect(conninfo) as conn:
        for i in range(n // 4):
            agg = aggs[rnd.randrange(2)]
            with conn.transaction(), conn.cursor() as cur:
                id = emit(cur, agg, "order.placed", {"w": w, "i": i}, {"n": str(i)})
                time.sleep(rnd.random() / 500)
                cur.execute("SELECT coalesce(max(id), 0) FROM events_outbox WHERE aggregate_id = %s AND id <> %s", (agg, id))
                seen = cur.fetchone()[0]
                if seen > id:
                    with lock:
                        failures.append(f"event {id} of {agg} commits after event {seen}")
            with lock:
                out.append(f"{agg} {id}")


threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
place_order(conninfo, aggs[0], 4200)
for line in out:
    print(line)
if failures:
    sys.exit("\n".join(failures))
