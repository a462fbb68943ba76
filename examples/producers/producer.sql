BEGIN;
-- ... the business writes, e.g. INSERT INTO orders ...
SELECT events_outbox_emit('6ba7b810-9dad-11d1-80b4-00c04fd430c8',
                          'order.placed', '{"total": 42}',
                          '{"trace": "00-4bf92f3577b34da6-01"}');
COMMIT;
