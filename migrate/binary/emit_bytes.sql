-- <outbox>_emit_bytes: <outbox>_emit for a payload of exact bytes and its
-- content type, on an outbox with binary payloads on (`outbox migrate up
-- --binary-payloads`). Call it inside the transaction that makes the
-- business writes:
--
--   SELECT events_outbox_emit_bytes('6ba7b810-9dad-11d1-80b4-00c04fd430c8',
--                                   'order.placed', '\x0a0234321001'::bytea,
--                                   'application/x-protobuf', '{"trace": "x"}');
--
-- The relayer publishes payload byte for byte, with the content-type
-- header (or property) set to content_type. The checks are <outbox>_emit's,
-- with SQLSTATE 22023 (22004 for a NULL argument) and a hint: the type's
-- topic, the headers, and the Kafka record's size, counted with the raw
-- bytes and this content type in place of application/json. The content
-- type is 1-255 printable ASCII characters with a '/' after the first, as
-- the table's CHECK has it. Then the same per-aggregate lock, id and
-- NOTIFY as <outbox>_emit.
CREATE OR REPLACE FUNCTION {{emit_bytes_fn}}(aggregate_id uuid, type text, payload bytea, content_type text, headers jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  topic  text := split_part(type, '.', 1);
  bad    text;
  fields int[];
  nhdr   int := 4; -- event_id, event_type, content-type, event_source
  body   int := 16; -- the record's attributes and deltas at their largest
  size   int;
  h      bigint := 2166136261;
  b      int;
  id     bigint;
BEGIN
  IF aggregate_id IS NULL OR type IS NULL OR payload IS NULL OR content_type IS NULL THEN
    RAISE EXCEPTION 'outbox: aggregate_id, type, payload and content_type must not be NULL'
      USING ERRCODE = '22004', HINT = 'headers may be NULL; pass ''''::bytea for an empty payload';
  END IF;
  IF aggregate_id = '00000000-0000-0000-0000-000000000000' THEN
    RAISE EXCEPTION 'outbox: aggregate id is the nil UUID (type %)', quote_literal(left(type, 64))
      USING ERRCODE = '22023', HINT = 'pass the id of the entity the event is about';
  END IF;
  IF type = '' THEN
    RAISE EXCEPTION 'outbox: event type is empty'
      USING ERRCODE = '22023', HINT = 'name the event "topic.event", e.g. ''order.placed''';
  END IF;
  IF topic = '' THEN
    RAISE EXCEPTION 'outbox: event type % starts with ''.'', so it names no topic', quote_literal(left(type, 64))
      USING ERRCODE = '22023', HINT = 'name the event "topic.event", e.g. ''order.placed''';
  END IF;
  IF octet_length(topic) > 249 THEN
    RAISE EXCEPTION 'outbox: event type % routes to a topic name of % bytes; Kafka allows at most 249', quote_literal(left(type, 64)), octet_length(topic)
      USING ERRCODE = '22023', HINT = 'shorten the part of the type before its first ''.''';
  END IF;
  IF topic !~ '^[a-zA-Z0-9_-]+$' THEN
    RAISE EXCEPTION 'outbox: event type % routes to topic %, which holds a character Kafka refuses', quote_literal(left(type, 64)), quote_literal(left(topic, 64))
      USING ERRCODE = '22023', HINT = 'Kafka topics use only letters, digits, ''.'', ''_'' and ''-''; the part of the type before its first ''.'' is the topic';
  END IF;
  IF content_type = '' OR octet_length(content_type) > 255 OR content_type !~ '^[!-~]+/[ -~]*$' OR content_type ~ ' $' THEN
    RAISE EXCEPTION 'outbox: content type % is not a media type of 1-255 printable ASCII characters (type %)', quote_literal(left(content_type, 64)), quote_literal(left(type, 64))
      USING ERRCODE = '22023', HINT = 'name the payload''s format, e.g. ''application/x-protobuf'' or ''application/avro''';
  END IF;

  fields := ARRAY[36, octet_length(payload),  -- key, value
                  8, 19, 10, octet_length(type), 12, octet_length(content_type), 12, 200]; -- the relayer's headers
  IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'null' THEN
    IF jsonb_typeof(headers) <> 'object' THEN
      RAISE EXCEPTION 'outbox: headers are a JSON %, not an object (type %)', jsonb_typeof(headers), quote_literal(left(type, 64))
        USING ERRCODE = '22023', HINT = 'pass NULL or an object of string values, e.g. ''{"trace": "abc"}''';
    END IF;
    SELECT k INTO bad FROM jsonb_each(headers) AS e(k, v) WHERE k = '' OR jsonb_typeof(v) <> 'string' LIMIT 1;
    IF FOUND THEN
      RAISE EXCEPTION 'outbox: header % is empty or its value is not a string (type %)', quote_literal(left(bad, 64)), quote_literal(left(type, 64))
        USING ERRCODE = '22023', HINT = 'header names are non-empty and values are JSON strings: write numbers as "3"';
    END IF;
    SELECT k INTO bad FROM jsonb_object_keys(headers) AS k WHERE k IN ('event_id', 'event_type', 'content-type', 'event_source') LIMIT 1;
    IF FOUND THEN
      RAISE EXCEPTION 'outbox: header % is set by the relayer (type %)', quote_literal(bad), quote_literal(left(type, 64))
        USING ERRCODE = '22023', HINT = 'use another name; event_id, event_type, content-type and event_source are reserved';
    END IF;
    SELECT fields || array_agg(octet_length(k)) || array_agg(octet_length(v)), nhdr + count(*)
      INTO fields, nhdr FROM jsonb_each_text(headers) AS e(k, v);
  END IF;

  -- outbox.KafkaRouting.Size: each field a zigzag varint length and its bytes,
  -- the header count, then the body's length and the batch header (61).
  SELECT body + sum(f + CASE WHEN f < 64 THEN 1 WHEN f < 8192 THEN 2 WHEN f < 1048576 THEN 3 WHEN f < 134217728 THEN 4 ELSE 5 END)
    INTO body FROM unnest(fields) AS f;
  body := body + CASE WHEN nhdr < 64 THEN 1 WHEN nhdr < 8192 THEN 2 ELSE 3 END;
  size := 61 + body + CASE WHEN body < 64 THEN 1 WHEN body < 8192 THEN 2 WHEN body < 1048576 THEN 3 WHEN body < 134217728 THEN 4 ELSE 5 END;
  IF size > 1048588 THEN
    RAISE EXCEPTION 'outbox: event type % makes a record of % bytes as the broker will see it, of which the payload is %; the limit is 1048588 (Kafka''s default message.max.bytes)', quote_literal(left(type, 64)), size, fields[2]
      USING ERRCODE = '22023', HINT = 'shrink the event, or emit it from Go with Config.MaxRecordBytes set to the topic''s max.message.bytes';
  END IF;

  -- lockkey.Bucket: FNV-1a (32-bit) of the id's 16 bytes, mod 1024.
  FOR i IN 0..15 LOOP
    b := get_byte(uuid_send(aggregate_id), i);
    h := ((h # b) * 16777619) & 4294967295;
  END LOOP;
  PERFORM pg_advisory_xact_lock({{emit_lock_ns}}, (h % 1024)::int);

  INSERT INTO {{outbox}} AS o (aggregate_id, type, payload_bytes, content_type, headers)
  VALUES (aggregate_id, type, payload, content_type, headers)
  RETURNING o.id INTO id;

  IF pg_try_advisory_xact_lock({{emit_lock_ns}}, -1) THEN -- lockkey.NotifyBucket
    PERFORM pg_notify({{channel}}, '');
  END IF;
  RETURN id;
END
$fn$;

COMMENT ON FUNCTION {{emit_bytes_fn}}(uuid, text, bytea, text, jsonb) IS
  'outbox: insert one event whose payload is exact bytes of content_type within the caller''s transaction, validated and ordered per aggregate as Go''s outbox.Emit does; returns its id';
