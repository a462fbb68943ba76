-- The last permanent publish failure of each stuck event, written by the
-- relay process that saw it, so that `outbox watchdog` (another process,
-- perhaps another host) can say why a row is stuck. One row per event, a
-- handful in a healthy system; rows whose event is no longer pending are
-- pruned by cleanup. No foreign key to the outbox: it would put a lookup on
-- every cleanup delete, for a table that is almost always empty.
CREATE TABLE {{failures}} (
  event_id         BIGINT      PRIMARY KEY,
  aggregate_id     UUID        NOT NULL,
  type             TEXT        NOT NULL,
  error            TEXT        NOT NULL,
  attempts         INT         NOT NULL DEFAULT 1,
  first_failed_at  TIMESTAMPTZ NOT NULL,
  failed_at        TIMESTAMPTZ NOT NULL
);
