package sqltext_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/lockkey"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

func TestRenderFillsEveryPlaceholder(t *testing.T) {
	t.Parallel()
	ids := sqltext.For("plan_x", "orders_outbox", "orders_seen")
	got := sqltext.Render(`SELECT 1 FROM {{outbox}} o JOIN {{failures}} f ON f.event_id = o.id, {{parked}}, {{processed}}, {{migrations}} -- {{schema}} {{pending_idx}} {{aggregate_idx}} {{processed_at_idx}} {{emit_fn}} {{emit_lock_ns}} {{channel}} {{guard_fn}} {{guard_trigger}}`, ids)
	require.Equal(t, `SELECT 1 FROM "plan_x"."orders_outbox" o JOIN "plan_x"."orders_outbox_failures" f ON f.event_id = o.id, "plan_x"."orders_outbox_parked", "plan_x"."orders_seen", "plan_x"."orders_outbox_migrations" -- "plan_x" "orders_outbox_pending_idx" "orders_outbox_aggregate_pending_idx" "orders_seen_processed_at_idx" "plan_x"."orders_outbox_emit" `+
		strconv.Itoa(int(lockkey.Emit("plan_x", "orders_outbox")))+` '`+lockkey.Channel("plan_x", "orders_outbox")+`' "plan_x"."orders_outbox_guard" "orders_outbox_guard"`, got)
}

func TestRenderPanicsOnWhatItCannotFill(t *testing.T) {
	t.Parallel()
	ids := sqltext.For("public", "events_outbox", "processed_events")
	require.PanicsWithValue(t, "sqltext: no identifier for placeholder {{table}} (known: schema, outbox, processed, failures, parked, migrations, pending_idx, aggregate_idx, processed_at_idx, emit_fn, emit_lock_ns, channel, guard_fn, guard_trigger, id_seq, id_drawn_fn, emit_message_fn, message_prefix, emit_bytes_fn, payload_check, parked_payload_check, payload_json_only, partitioning, layout_move, lanes)",
		func() { sqltext.Render(`SELECT 1 FROM {{table}}`, ids) })
	require.Panics(t, func() { sqltext.Render(`SELECT 1 FROM {{outbox`, ids) }, "unclosed")
	require.Panics(t, func() { sqltext.Render(`SELECT 1 FROM {{outbox}}`, sqltext.Idents{}) }, "zero Idents")
}

// Derived names are cut to Postgres' 63 bytes, as the server would cut
// them (silently): the SQL names what the server creates.
func TestForCutsDerivedNames(t *testing.T) {
	t.Parallel()
	long := "o234567890123456789012345678901234567890" // 40 bytes, as Tables.Validate allows
	ids := sqltext.For("s", long, "p")
	require.Equal(t, `"s"."`+long+`_failures"`, ids.Failures)
	processed := "p2345678901234567890123456789012345678901234567890" // 50 bytes
	ids = sqltext.For("s", "x", processed)
	require.Equal(t, `"`+processed+`_processed_at"`, ids.ProcessedAtIdx)
}
