import psycopg
from psycopg.types.json import Jsonb


def emit(cur, aggregate_id, type, payload, headers=None):
    """Write one event in cur's transaction; it exists iff that commits."""
    cur.execute(
        "SELECT events_outbox_emit(%s, %s, %s, %s)",
        (aggregate_id, type, Jsonb(payload),
         None if headers is None else Jsonb(headers)),
    )
    return cur.fetchone()[0]


def place_order(conninfo, order_id, total_cents, currency="EUR"):
    with psycopg.connect(conninfo) as conn:  # commits when the block ends
        with conn.cursor() as cur:
            # ... the business writes, e.g. INSERT INTO orders ...
            # order.placed v2 (examples/contracts): integer cents and a
            # currency; the event_version header names the version.
            return emit(cur, order_id, "order.placed",
                        {"order_id": str(order_id), "total_cents": total_cents,
                         "currency": currency},
                        {"event_version": "2",
                         "trace": "00-4bf92f3577b34da6-01"})
