DROP TABLE IF EXISTS {{processed}};
DROP TABLE IF EXISTS {{outbox}};
