-- Back to migration 6's guard: any INSERT may choose its own id, and a row
-- with requeued_at set skips every check. The id function goes last: the
-- trigger's WHEN calls it until the trigger is replaced.
DROP FUNCTION IF EXISTS {{emit_message_fn}}(uuid, text, jsonb, jsonb);

CREATE OR REPLACE FUNCTION {{guard_fn}}()
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

CREATE OR REPLACE TRIGGER {{guard_trigger}}
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

DROP FUNCTION IF EXISTS {{id_drawn_fn}}(bigint);
