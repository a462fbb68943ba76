-- Holds live here, shared by every relayer, instead of in one relayer's
-- memory: when a row fails for good (the broker refuses it, or the relayer
-- cannot decode it), the relayer that saw it records why and until when its
-- aggregate is held out of claims, in the batch's own transaction. Every
-- relayer's claim skips aggregates with an active hold on a pending row, so
-- no replica retries what another just saw fail, and `outbox events retry`
-- lifts a hold for all of them at once. reason is a short code (too_large,
-- undecodable, invalid_topic, reserved_header, broker_refused) for metrics
-- and alerts; error is the whole message.
ALTER TABLE {{.Failures}}
  ADD COLUMN reason     TEXT        NOT NULL DEFAULT 'broker_refused',
  ADD COLUMN held_until TIMESTAMPTZ;

-- Parked rows: taken out of the outbox by `outbox events park` so that the
-- later rows of their aggregate flow (a deliberate break of that
-- aggregate's order), kept whole with why, until `outbox events unpark`
-- puts them back under their original id.
CREATE TABLE {{.Parked}} (
  id            BIGINT      PRIMARY KEY,
  aggregate_id  UUID        NOT NULL,
  type          TEXT        NOT NULL,
  payload       JSONB       NOT NULL,
  headers       JSONB,
  created_at    TIMESTAMPTZ NOT NULL,
  parked_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
  reason        TEXT        NOT NULL,
  last_error    TEXT
);
