DROP FUNCTION IF EXISTS {{emit_fn}}(uuid, text, jsonb, jsonb);
