DROP TRIGGER IF EXISTS {{guard_trigger}} ON {{outbox}};
DROP FUNCTION IF EXISTS {{guard_fn}}();
