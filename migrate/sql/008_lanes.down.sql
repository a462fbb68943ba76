-- Relayers running with exactly-once must be stopped first: an open
-- reservation's rows stay dispatched, whether or not they reached Kafka.
DROP TABLE IF EXISTS {{lanes}};
