CREATE SCHEMA IF NOT EXISTS {{schema}};

CREATE TABLE {{outbox}} (
  id            BIGSERIAL   PRIMARY KEY,
  aggregate_id  UUID        NOT NULL,
  type          TEXT        NOT NULL,
  payload       JSONB       NOT NULL,
  headers       JSONB,
  created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
  dispatched_at TIMESTAMPTZ
);

-- The relayer claims pending rows ORDER BY id. An index on (created_at)
-- WHERE dispatched_at IS NULL (the seed's) does not serve that order, so
-- Postgres walks the primary key instead and filters out every dispatched
-- row in front of the pending ones, a cost growing with the table. This
-- partial index holds pending rows only, in claim order, so a claim costs
-- the same with 0 or 10M dispatched rows.
CREATE INDEX {{pending_idx}} ON {{outbox}} (id) WHERE dispatched_at IS NULL;

-- Per-aggregate order: the claim checks that the rows it takes are the
-- oldest pending rows of their aggregate, walking this index per aggregate.
CREATE INDEX {{aggregate_idx}} ON {{outbox}} (aggregate_id, id) WHERE dispatched_at IS NULL;

-- Consumer dedupe. source tells apart events of different outbox tables
-- (event_id is only unique within one): the relayer stamps it into each
-- record's event_source header, and it is part of the key.
--
-- Several outboxes of one schema share it by default (--processed-table
-- is processed_events for all), so the second outbox's migration finds it
-- there: IF NOT EXISTS, and the down migration drops it only when no
-- other outbox of the schema is migrated.
CREATE TABLE IF NOT EXISTS {{processed}} (
  consumer     TEXT        NOT NULL,
  source       TEXT        NOT NULL DEFAULT '',
  event_id     BIGINT      NOT NULL,
  processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, source, event_id)
);

-- A table of that name made by something else is not adopted silently:
-- this fails ("column ... does not exist") unless it has the columns the
-- consumer writes.
SELECT consumer, source, event_id, processed_at FROM {{processed}} LIMIT 0;

-- Retention cleanup deletes by age.
CREATE INDEX IF NOT EXISTS {{processed_at_idx}} ON {{processed}} (processed_at);
