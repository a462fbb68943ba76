DROP TABLE IF EXISTS {{outbox}};

-- The processed table may be shared by other outboxes of this schema (it
-- is created IF NOT EXISTS). Drop it only when no other outbox here is
-- migrated: no other bookkeeping table (<outbox>_migrations: version and
-- applied_at columns) records a version. The database does not
-- record which processed table another outbox's consumers use, so this
-- keeps the table whenever one is, and says so.
DO $outbox$
DECLARE
  bookkeeping regclass;
  others      text[] := '{}';
  applied     boolean;
BEGIN
  FOR bookkeeping IN
    SELECT c.oid::regclass
    FROM pg_class c
    WHERE c.relnamespace = '{{schema}}'::regnamespace
      AND c.relkind IN ('r', 'p')
      AND c.relname LIKE '%\_migrations'
      AND c.oid IS DISTINCT FROM to_regclass('{{migrations}}')
      AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'version' AND NOT a.attisdropped)
      AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'applied_at' AND NOT a.attisdropped)
  LOOP
    EXECUTE format('SELECT EXISTS (SELECT FROM %s WHERE version >= 1)', bookkeeping) INTO applied;
    IF applied THEN
      others := others || bookkeeping::text;
    END IF;
  END LOOP;
  IF cardinality(others) = 0 THEN
    DROP TABLE IF EXISTS {{processed}};
  ELSE
    RAISE NOTICE 'kept % : other outboxes of this schema are migrated (%); drop it once no consumer uses it',
      '{{processed}}', array_to_string(others, ', ');
  END IF;
END
$outbox$;
