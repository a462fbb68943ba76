-- Ids belong to the outbox. Every writer draws an event's id from the
-- outbox's sequence, never chooses it. A plain INSERT that names its own id
-- fails with SQLSTATE 428C9 (generated_always, the code Postgres gives an
-- identity column) and a hint. Such an id may be an event that already
-- exists: consumers dedupe on it and skip the real event as done. Or it
-- is an id the sequence will hand out later: the real Emit that draws it
-- then fails with a duplicate key.
--
-- The check: a BEFORE INSERT trigger sees NEW.id after the column default
-- has run, so it cannot tell DEFAULT from a value that was written out.
-- But the default is nextval, and nextval runs for each row before that
-- row's BEFORE triggers fire. This holds for a one-row INSERT, for
-- INSERT ... VALUES of many rows, for INSERT ... SELECT (Emit's batch,
-- ordered) and for COPY. So a drawn id is currval of the sequence in this
-- session, and {{id_drawn_fn}} compares with that. A session that never
-- drew has no currval (SQLSTATE 55000). A role without USAGE on the
-- sequence cannot read it (42501). In both cases the id was not drawn, and
-- the guard says so. Nothing can change currval except drawing a fresh value:
-- setval needs UPDATE on the sequence, which a producer does not have.
-- What a session can do is repeat its own last id. That id is already
-- in the table, so the primary key refuses it, unless no row holds it any
-- more (deleted or parked) or none ever did (ModeMessage sent it as a
-- message). A session never gets another session's id.
--
-- Why not GENERATED ALWAYS AS IDENTITY: any role that may INSERT may also
-- write OVERRIDING SYSTEM VALUE (checked on Postgres 15: the identity
-- column then takes the id), and the identity error's hint recommends
-- exactly that. Converting the column would also replace the sequence
-- that producers hold USAGE on. ModeMessage's function (below) draws ids
-- from that sequence by name.
--
-- The operator's bypass. `outbox events unpark` puts a parked row back
-- whole: under its old id, possibly one that breaks a rule (written before
-- migration 6), with requeued_at set. Migration 6 let any row with
-- requeued_at set skip the checks, so a plain INSERT could set it too. Now
-- the skip also needs the inserting role (current_user) to be a member of
-- the table's owner (pg_has_role ... 'MEMBER'; superusers are). That role
-- can already turn the trigger off (ALTER TABLE ... DISABLE TRIGGER), so
-- the skip gives nobody anything new. A setting (SET LOCAL of a custom GUC)
-- would not do: any role can set one. From any other role, requeued_at
-- changes nothing: the row is checked like any other.
--
-- Cost: the id check is a small plpgsql call in the trigger's WHEN, every
-- row; most of it is the exception block that catches the 55000 above. The
-- rest of the function still runs only for a row that fails. The migration replaces a function
-- and the trigger's definition (CREATE OR REPLACE TRIGGER, a SHARE ROW
-- EXCLUSIVE lock for an instant). It neither scans nor rewrites the table,
-- and rows already in it stay as they are.
CREATE OR REPLACE FUNCTION {{id_drawn_fn}}(id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
AS $fn$
BEGIN
  -- Qualified names: no search_path of the caller's can change what this
  -- compares (a SET clause would cost a GUC save and restore per row).
  RETURN id OPERATOR(pg_catalog.=) pg_catalog.currval('{{id_seq}}'::pg_catalog.regclass);
EXCEPTION WHEN object_not_in_prerequisite_state OR insufficient_privilege THEN
  RETURN false;
END
$fn$;

COMMENT ON FUNCTION {{id_drawn_fn}}(bigint) IS
  'outbox: whether id is the value this session last drew from the outbox''s id sequence (the guard refuses an INSERT that chose its own id)';

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
  IF NEW.requeued_at IS NOT NULL
     AND pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
    RETURN NEW;
  END IF;
  IF NOT coalesce({{id_drawn_fn}}(NEW.id), false) THEN
    RAISE EXCEPTION 'outbox: an INSERT into % may not choose the event id (it wrote id %)', TG_TABLE_NAME, NEW.id
      USING ERRCODE = 'generated_always', COLUMN = 'id', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            DETAIL = 'Event ids come from the outbox''s sequence: consumers deduplicate on them, and an id chosen by the writer can be another event''s.',
            HINT = 'leave id out of the column list (or write DEFAULT) and let the outbox draw it; to send an event again, use `outbox events replay` or `outbox events unpark`';
  END IF;
  IF NEW.type = '' THEN
    RAISE EXCEPTION 'outbox: event type is empty, so it names no topic'
      USING ERRCODE = 'check_violation', CONSTRAINT = rule, SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            HINT = 'name the event "topic.event", e.g. ''order.placed''';
  END IF;
  IF topic = '' THEN
    RAISE EXCEPTION 'outbox: event type % starts with ''.'', so it names no topic', quote_literal(left(NEW.type, 64))
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

-- Migration 6's WHEN, without its requeued_at exemption and with the id
-- check in front: a drawn id and a row that passes the rules never reach
-- the function.
CREATE OR REPLACE TRIGGER {{guard_trigger}}
BEFORE INSERT ON {{outbox}}
FOR EACH ROW
WHEN (NOT coalesce({{id_drawn_fn}}(NEW.id), false) OR NOT (
  NEW.type ~ '^[a-zA-Z0-9_-]+(\.|$)' AND octet_length(split_part(NEW.type, '.', 1)) <= 249
  AND (NEW.headers IS NULL OR jsonb_typeof(NEW.headers) = 'null'
       OR (jsonb_typeof(NEW.headers) = 'object'
           AND NOT NEW.headers ?| '{event_id,event_type,content-type,event_source}'::text[]
           AND NOT NEW.headers ? ''
           AND NOT jsonb_path_exists(NEW.headers, 'strict $.* ? (@.type() != "string")', '{}', true)))))
EXECUTE FUNCTION {{guard_fn}}();

COMMENT ON TRIGGER {{guard_trigger}} ON {{outbox}} IS
  'outbox: refuse a plain INSERT that chooses its own id (SQLSTATE 428C9) or of a row the relayer could never publish (SQLSTATE 23514): bad headers (<outbox>_headers_shape) or a type naming no valid topic (<outbox>_type_topic)';

-- <outbox>_emit_message: a message-mode event (outbox.ModeMessage), the
-- one way producers write one. The WAL source with message-mode events on
-- publishes the id a logical message carries, so whoever could write the
-- message itself (pg_logical_emit_message) could choose that id. This
-- function runs as its owner (SECURITY DEFINER): a producer needs EXECUTE
-- on it alone, neither on pg_logical_emit_message nor INSERT on the
-- outbox, and it draws the id from the outbox's sequence itself. Call it
-- inside the transaction that makes the business writes (the message
-- exists iff that commits):
--
--   SELECT events_outbox_emit_message('6ba7b810-9dad-11d1-80b4-00c04fd430c8',
--                                     'order.placed', '{"total": 42}', '{"trace": "x"}');
--
-- It refuses, with SQLSTATE 22023 (22004 for a NULL argument), what the
-- relay could not publish, as the guard does for a row: a nil aggregate,
-- a type naming no valid topic, headers not an object of string values or
-- naming one the relayer sets. The record's size is Go's Emit's to check
-- (against its Config.MaxRecordBytes), as it is for a plain INSERT. The
-- message carries no created_at: the relay uses the commit time.
--
-- Nobody may call it until granted (REVOKE below):
--   GRANT EXECUTE ON FUNCTION events_outbox_emit_message(uuid, text, jsonb, jsonb) TO <producers>;
-- Its owner (the role that ran this migration) needs EXECUTE on
-- pg_logical_emit_message: superusers have it; once it is revoked from
-- PUBLIC, grant it to a non-superuser owner.
CREATE OR REPLACE FUNCTION {{emit_message_fn}}(aggregate_id uuid, type text, payload jsonb, headers jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  topic text := split_part(type, '.', 1);
  bad   text;
  id    bigint;
BEGIN
  IF aggregate_id IS NULL OR type IS NULL OR payload IS NULL THEN
    RAISE EXCEPTION 'outbox: aggregate_id, type and payload must not be NULL'
      USING ERRCODE = '22004', HINT = 'headers may be NULL; pass ''{}''::jsonb for an empty payload';
  END IF;
  IF aggregate_id = '00000000-0000-0000-0000-000000000000' THEN
    RAISE EXCEPTION 'outbox: aggregate id is the nil UUID (type %)', quote_literal(left(type, 64))
      USING ERRCODE = '22023', HINT = 'pass the id of the entity the event is about';
  END IF;
  IF topic = '' OR octet_length(topic) > 249 OR topic !~ '^[a-zA-Z0-9_-]+$' THEN
    RAISE EXCEPTION 'outbox: event type % names no valid Kafka topic (%)', quote_literal(left(type, 64)), quote_literal(left(topic, 64))
      USING ERRCODE = '22023', HINT = 'name the event "topic.event", e.g. ''order.placed'': the part before the first ''.'' is the topic, 1-249 letters, digits, ''_'' or ''-''';
  END IF;
  IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'null' THEN
    IF jsonb_typeof(headers) <> 'object' THEN
      RAISE EXCEPTION 'outbox: headers are a JSON %, not an object (type %)', jsonb_typeof(headers), quote_literal(left(type, 64))
        USING ERRCODE = '22023', HINT = 'pass NULL or an object of string values, e.g. ''{"trace": "abc"}''';
    END IF;
    SELECT k INTO bad FROM jsonb_each(headers) AS e(k, v)
      WHERE k = '' OR jsonb_typeof(v) <> 'string' OR k IN ('event_id', 'event_type', 'content-type', 'event_source') LIMIT 1;
    IF FOUND THEN
      RAISE EXCEPTION 'outbox: header % is empty, is not a string or is set by the relayer (type %)', quote_literal(left(bad, 64)), quote_literal(left(type, 64))
        USING ERRCODE = '22023', HINT = 'header names are non-empty, values are JSON strings, and event_id, event_type, content-type and event_source are reserved';
    END IF;
  END IF;

  id := nextval('{{id_seq}}'::regclass);
  PERFORM pg_logical_emit_message(true, {{message_prefix}}, json_build_object('id', id,
    'aggregate_id', aggregate_id, 'type', type, 'payload', payload, 'headers', headers)::text);
  RETURN id;
END
$fn$;

REVOKE EXECUTE ON FUNCTION {{emit_message_fn}}(uuid, text, jsonb, jsonb) FROM PUBLIC;

COMMENT ON FUNCTION {{emit_message_fn}}(uuid, text, jsonb, jsonb) IS
  'outbox: write one message-mode event (a transactional logical message) within the caller''s transaction, its id drawn from the outbox''s sequence; returns the id. Runs as its owner: grant producers EXECUTE on it, not on pg_logical_emit_message';
