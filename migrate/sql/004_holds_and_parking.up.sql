-- Holds live here, shared by every relayer, instead of in one relayer's
-- memory: when a row fails for good (the broker refuses it, or the relayer
-- cannot decode it), the relayer that saw it records why and until when its
-- aggregate is held out of claims, in the batch's own transaction. Every
-- relayer's claim skips aggregates with an active hold on a pending row, so
-- no replica retries what another just saw fail, and `outbox events retry`
-- lifts a hold for all of them at once. reason is a short code (too_large,
-- undecodable, invalid_topic, reserved_header, broker_refused) for metrics
-- and alerts; error is the whole message.
ALTER TABLE {{failures}}
  ADD COLUMN reason     TEXT        NOT NULL DEFAULT 'broker_refused',
  ADD COLUMN held_until TIMESTAMPTZ;

-- Parked rows: taken out of the outbox by `outbox events park` so that the
-- later rows of their aggregate flow (a deliberate break of that
-- aggregate's order), kept whole with why, until `outbox events unpark`
-- puts them back under their original id.
CREATE TABLE {{parked}} (
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

-- When an operator last put a row back to pending (`outbox events replay`,
-- `outbox events unpark`); NULL for a row pending since its insert.
-- created_at stays the event's own time (cleanup walks ids in created_at
-- order), while lag, stuck rows and commit-to-publish latency measure from
-- coalesce(requeued_at, created_at): how long the row has waited this time.
-- A nullable column without a default: adding it rewrites nothing, and
-- Emit never sets it.
ALTER TABLE {{outbox}} ADD COLUMN requeued_at TIMESTAMPTZ;
