package consumer

import (
	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

// The processed table's primary key (consumer, source, event_id) serves
// every statement here: the conflict check of the inserts is a lookup of
// that key, and nothing else reads the table on the processing path.

// insertOneSQL records one event; no row affected means it was processed
// before. A concurrent transaction inserting the same key makes this one
// wait for it: if it commits, this is a duplicate; if it rolls back, this
// one inserts. So two consumers of one name never both run the handler.
const insertOneSQL = `INSERT INTO {{processed}} (consumer, source, event_id) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING`

// insertManySQL records a batch in one round trip and returns the keys that
// were new. Arrays keep the statement text fixed whatever the batch size
// (one prepared statement). The input is sorted and unique by key, and
// inserted in that order (ORDER BY ord).
const insertManySQL = `INSERT INTO {{processed}} (consumer, source, event_id)
SELECT $1, e.source, e.event_id
FROM unnest($2::text[], $3::int8[]) WITH ORDINALITY AS e(source, event_id, ord)
ORDER BY e.ord
ON CONFLICT DO NOTHING
RETURNING source, event_id`

// checkSQL fails when the table or one of the columns the processor needs
// is missing (an old schema without the source column, say).
const checkSQL = `SELECT consumer, source, event_id FROM {{processed}} LIMIT 0`

var _ = sqltext.Register("consumer", map[string]string{
	"insertOneSQL": insertOneSQL, "insertManySQL": insertManySQL, "checkSQL": checkSQL,
})

// render fills a statement's {{processed}} with tables' quoted name (tables
// with defaults applied).
func render(sql string, tables outbox.Tables) string {
	return sqltext.Render(sql, sqltext.For(tables.Schema, tables.Outbox, tables.Processed))
}
