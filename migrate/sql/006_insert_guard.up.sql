-- The insert-time guard: a plain INSERT INTO the outbox (a producer that
-- does not call Emit or <outbox>_emit) of a row the relayer could never
-- publish fails the producer's transaction, with SQLSTATE 23514
-- (check_violation), the violated rule in the error's constraint name and
-- a hint, instead of being held at relay time while its aggregate waits:
--
--   <outbox>_headers_shape  headers are SQL NULL, JSON null, or a JSON
--                           object whose names are non-empty and not set by
--                           the relayer (event_id, event_type, content-type,
--                           event_source) and whose values are all strings;
--   <outbox>_type_topic     the type's topic (the part before its first
--                           '.') is 1-249 of [a-zA-Z0-9_-].
--
-- These are the rules of <outbox>_emit and of Go's Emit (outbox.Topic,
-- outbox.IsReservedHeader), which check first and never reach the guard. A
-- relayer with a TopicPrefix routes a type to prefix + topic, which may then
-- pass 249 characters: such a row passes the guard and is held at relay
-- time (invalid_topic), as Emit with the same TopicPrefix would refuse it.
-- Size is not checked: a topic's max.message.bytes is the broker's, and the
-- relayer's too_large hold is the guard for it, and a size check here would
-- cost every insert.
--
-- A trigger, not CHECK constraints. A CHECK constraint is enforced on every
-- new row version, UPDATEs included, even when added NOT VALID: the claim
-- marks a row dispatched (and sets it back to pending when the broker
-- refuses it) with an UPDATE, which on a row written before this migration
-- that breaks the rule would fail the whole claim statement, stopping the
-- relayer for every aggregate instead of holding one row. The trigger runs
-- on INSERT only, so rows already in the table move (or are held) as
-- before, and it needs no validation pass: it never scans the table, and
-- adding it takes a SHARE ROW EXCLUSIVE lock for an instant. Rows already
-- pending that break a rule are held by the relayer with their reason
-- (undecodable, reserved_header, invalid_topic) and shown by `outbox
-- watchdog`; `outbox events park` takes them out.
--
-- The WHEN clause is the whole check, evaluated in the executor without a
-- function call; the function runs only for a row that fails it, to say
-- which rule and why. A row with requeued_at set is an operator's unpark
-- (ops.Unpark puts a parked row back whole): it was written before, so it
-- is let through and the relayer holds it again if it must.
CREATE FUNCTION {{guard_fn}}()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  topic text := split_part(NEW.type, '.', 1);
  rule  text := TG_TABLE_NAME || '_type_topic';
  bad   text;
BEGIN
  IF NEW.requeued_at IS NOT NULL THEN
    RETURN NEW;
  END IF;
  IF topic = '' THEN
    RAISE EXCEPTION 'outbox: event type % names no topic (it is empty or starts with ''.'')', quote_literal(left(NEW.type, 64))
      USING ERRCODE = 'check_violation', CONSTRAINT = rule, SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            HINT = 'name the event "topic.event", e.g. ''order.placed''';
  END IF;
  IF octet_length(topic) > 249 THEN
    RAISE EXCEPTION 'outbox: event type % routes to a topic name of % bytes; Kafka allows at most 249', quote_literal(left(NEW.type, 64)), octet_length(topic)
      USING ERRCODE = 'check_violation', CONSTRAINT = rule, SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            HINT = 'shorten the part of the type before its first ''.''';
  END IF;
  IF topic !~ '^[a-zA-Z0-9_-]+$' THEN
    RAISE EXCEPTION 'outbox: event type % routes to topic %, which holds a character Kafka refuses', quote_literal(left(NEW.type, 64)), quote_literal(left(topic, 64))
      USING ERRCODE = 'check_violation', CONSTRAINT = rule, SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            HINT = 'Kafka topics use only letters, digits, ''.'', ''_'' and ''-''; the part of the type before its first ''.'' is the topic';
  END IF;

  rule := TG_TABLE_NAME || '_headers_shape';
  IF NEW.headers IS NULL OR jsonb_typeof(NEW.headers) = 'null' THEN
    RETURN NEW;
  END IF;
  IF jsonb_typeof(NEW.headers) <> 'object' THEN
    RAISE EXCEPTION 'outbox: headers are a JSON %, not an object (type %)', jsonb_typeof(NEW.headers), quote_literal(left(NEW.type, 64))
      USING ERRCODE = 'check_violation', CONSTRAINT = rule, SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            HINT = 'write NULL or an object of string values, e.g. ''{"trace": "abc"}''';
  END IF;
  SELECT k INTO bad FROM jsonb_each(NEW.headers) AS e(k, v) WHERE k = '' OR jsonb_typeof(v) <> 'string' LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'outbox: header % is empty or its value is not a string (type %)', quote_literal(left(bad, 64)), quote_literal(left(NEW.type, 64))
      USING ERRCODE = 'check_violation', CONSTRAINT = rule, SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            HINT = 'header names are non-empty and values are JSON strings: write numbers as "3"';
  END IF;
  SELECT k INTO bad FROM jsonb_object_keys(NEW.headers) AS k WHERE k IN ('event_id', 'event_type', 'content-type', 'event_source') LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'outbox: header % is set by the relayer (type %)', quote_literal(bad), quote_literal(left(NEW.type, 64))
      USING ERRCODE = 'check_violation', CONSTRAINT = rule, SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            HINT = 'use another name; event_id, event_type, content-type and event_source are reserved';
  END IF;
  RETURN NEW;
END
$fn$;

-- The topic: allowed characters up to a '.' or the end (the class holds no
-- '.', so the run is the whole part before the first '.'), at most 249 of
-- them; a bounded repetition in the pattern, {1,249}, costs 56 us a row
-- (Postgres expands it into 249 states), this 2 us. The headers: strict
-- jsonpath (lax would look inside an array value and pass ["x"]), silent
-- so that the order of the ANDs cannot matter; NULL headers, Emit's most
-- common case, stop at the first test.
CREATE TRIGGER {{guard_trigger}}
BEFORE INSERT ON {{outbox}}
FOR EACH ROW
WHEN (NEW.requeued_at IS NULL AND NOT (
  NEW.type ~ '^[a-zA-Z0-9_-]+(\.|$)' AND octet_length(split_part(NEW.type, '.', 1)) <= 249
  AND (NEW.headers IS NULL OR jsonb_typeof(NEW.headers) = 'null'
       OR (jsonb_typeof(NEW.headers) = 'object'
           AND NOT NEW.headers ?| '{event_id,event_type,content-type,event_source}'::text[]
           AND NOT NEW.headers ? ''
           AND NOT jsonb_path_exists(NEW.headers, 'strict $.* ? (@.type() != "string")', '{}', true)))))
EXECUTE FUNCTION {{guard_fn}}();

COMMENT ON TRIGGER {{guard_trigger}} ON {{outbox}} IS
  'outbox: refuse (SQLSTATE 23514) a plain INSERT of a row the relayer could never publish: bad headers (<outbox>_headers_shape) or a type naming no valid topic (<outbox>_type_topic)';
