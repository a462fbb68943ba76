BEGIN;
-- ... the business writes, e.g. INSERT INTO orders ...
SELECT events_outbox_emit('6ba7b810-9dad-11d1-80b4-00c04fd430c8',
                          'order.placed',
                          '{"order_id": "6ba7b810-9dad-11d1-80b4-00c04fd430c8", "total_cents": 4200, "currency": "EUR"}',
                          '{"event_version": "2", "trace": "00-4bf92f3577b34da6-01"}');
COMMIT;
