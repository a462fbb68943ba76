-- Lanes of the polling relay with exactly-once delivery (relay.Common.
-- ExactlyOnce). Each relayer process holds one lane under a lease it
-- renews; the lane names its broker transactional id (<TransactionalID>/
-- poll-<lane>), so a relayer that takes a lane over fences the one before.
-- A batch is claimed (marked dispatched) and reserved here in one
-- transaction before it is published: seq is the number of the lane's
-- latest reservation, ids and aggs its rows and their aggregates while its
-- broker transaction is in flight (NULL otherwise). The broker transaction
-- records seq as the lane's progress, so whoever takes the lane after a
-- crash compares the two: the reservation reached the broker (keep the rows
-- dispatched) or it did not (return them to pending). Other lanes' claims
-- skip the aggregates of every open reservation, so no later event of an
-- aggregate overtakes one whose fate is not known yet. A handful of rows:
-- statements read it whole or by its primary key.
CREATE TABLE {{lanes}} (
  lane        INT         PRIMARY KEY,
  owner       TEXT        NOT NULL,
  epoch       BIGINT      NOT NULL,
  lease_until TIMESTAMPTZ NOT NULL,
  seq         BIGINT      NOT NULL DEFAULT 0,
  ids         BIGINT[],
  aggs        UUID[]
);
