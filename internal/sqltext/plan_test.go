package sqltext_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	_ "github.com/pgoutbox/outbox/consumer" // registers its statements
	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/sqltext"
	"github.com/pgoutbox/outbox/migrate"
	_ "github.com/pgoutbox/outbox/ops"            // registers its statements
	_ "github.com/pgoutbox/outbox/ops/switchover" // registers its statements
	_ "github.com/pgoutbox/outbox/relay"          // registers its statements
)

// planTables is a non-default schema (the test's own) with non-default
// table names, so a statement that named a table or index by its default
// name, or unqualified, fails here.
func planTables(schema string) outbox.Tables {
	return outbox.Tables{Schema: schema, Outbox: "orders_outbox", Processed: "orders_seen"}
}

// Every package registers every statement it runs; each renders with
// nothing left to fill.
func TestEveryStatementRenders(t *testing.T) {
	t.Parallel()
	stmts := sqltext.Registered()
	pkgs := map[string]int{}
	for _, st := range stmts {
		pkgs[strings.Split(st.Name, ".")[0]]++
		sql := sqltext.Render(st.SQL, sqltext.For("plan_x", "orders_outbox", "orders_seen"))
		require.NotContains(t, sql, "{{", st.Name)
		require.NotContains(t, sql, "}}", st.Name)
	}
	for _, pkg := range []string{"outbox", "relay", "ops", "switchover", "cleanuplock", "consumer", "migrate", "partition"} {
		require.NotZero(t, pkgs[pkg], "package %s registers no statement", pkg)
	}
}

// The outbox table has two indexes, the primary key and the pending index;
// these statements must reach its rows through one of them: a sequential
// scan would make them cost the table's size, which grows with retention,
// instead of the backlog's or the batch's.
var noOutboxSeqScan = map[string]bool{
	"relay.claimSQL": true, "relay.claimBinarySQL": true, "relay.unmarkSQL": true, "relay.pendingSQL": true, "migrate.binaryRowsSQL": true,
	"relay.claimPartitionedSQL": true, "relay.claimBinaryPartitionedSQL": true, "ops.partitionRowsSQL": true,
	"relay.claimLanesSQL": true, "relay.claimBinaryLanesSQL": true, "relay.claimPartitionedLanesSQL": true, "relay.claimBinaryPartitionedLanesSQL": true,
	"relay.laneReturnSQL": true,
	"ops.lagSQL":          true, "ops.heldSQL": true, "ops.stuckSQL": true, "ops.rateSQL": true,
	"ops.idProbeSQL": true, "ops.idRangeSQL": true,
	"ops.outboxCleanupSQL": true, "ops.pruneFailuresSQL": true,
	"ops.showSQL": true, "ops.lockPendingSQL": true, "ops.lockPendingForUpdateSQL": true,
	"ops.parkSQL": true, "ops.laterPendingSQL": true,
	"ops.activeHoldsByEventSQL": true, "ops.activeHoldsByAggregateSQL": true,
	"ops.liftHoldsByEventSQL": true, "ops.liftHoldsByAggregateSQL": true,
	"ops.replaySQL": true, "ops.replayCountSQL": true, "ops.oldestIDSQL": true,
}

// Emit's inserts, the consumer's dedupe inserts and the relayer's hold
// upsert read no table: only their conflict checks probe a primary key.
var insertOnly = map[string]bool{
	"outbox.insertOneSQL": true, "outbox.insertOneLockSQL": true, "outbox.insertOneNotifySQL": true, "outbox.insertOneLockNotifySQL": true,
	"outbox.insertBatchSQL": true, "outbox.insertBatchNotifySQL": true,
	"outbox.insertBinaryOneSQL": true, "outbox.insertBinaryOneLockSQL": true, "outbox.insertBinaryOneNotifySQL": true, "outbox.insertBinaryOneLockNotifySQL": true,
	"outbox.insertBinaryBatchSQL": true, "outbox.insertBinaryBatchNotifySQL": true,
	"consumer.insertOneSQL": true, "consumer.insertManySQL": true, "relay.holdSQL": true,
}

type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	Plans        []planNode `json:"Plans"`
}

func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// TestStatementPlans EXPLAINs every registered statement of every package,
// rendered for planTables, against a migrated schema holding a drained
// table's shape (many dispatched rows, a backlog, a few held and parked
// rows, dedupe rows), analyzed, in both layouts: one table, and the
// partitioned layout (whose partitions count as the outbox table). Each
// runs with the generic plan Postgres caches for a prepared statement (the
// parameters are unknown), except the claim, which the relayer runs with
// sequential and bitmap scans off (relay.ClaimBegin; relay's
// TestClaimPlanUsesPendingIndex checks its custom plans in depth). The
// log lists, per statement, every table access: what touches the outbox,
// through which index. Templates (sqltext.RegisterTemplates: DDL, or a
// probe of a detached partition) and the partitioned layout's statements
// on the plain one are not planned.
func TestStatementPlans(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "partitioned"}[partitioned], func(t *testing.T) {
			t.Parallel()
			planStatements(t, partitioned)
		})
	}
}

func planStatements(t *testing.T, partitioned bool) {
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true, MaxConns: 2})
	tables := planTables(db.Tables.Schema).WithDefaults()
	m, err := migrate.New(tables)
	require.NoError(t, err)
	// With binary payloads on, so that the statements that read
	// payload_bytes plan too; the others do not read the columns.
	_, err = m.EnableBinaryPayloads(ctx, db.Pool)
	require.NoError(t, err)
	if partitioned {
		// Partitions of 20,000 ids: the seeds below fill two with
		// dispatched rows, a third with dispatched rows and the backlog,
		// and leave two empty ahead.
		_, err = m.EnablePartitioned(ctx, db.Pool, migrate.PartitionSettings{Width: 20_000})
		require.NoError(t, err)
		for from := int64(60_000); from < 100_000; from += 20_000 {
			_, err := partition.Add(ctx, db.Pool, tables, tables.Outbox, from, from+20_000)
			require.NoError(t, err)
		}
	}
	ids := sqltext.For(tables.Schema, tables.Outbox, tables.Processed)
	seedPlans(ctx, t, db, ids)

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// A partition ahead of the sequence holds no row: scanning it whole
	// costs nothing, and the planner does.
	empty := emptyPartitions(ctx, t, db, tables)
	tableNames := map[string]bool{tables.Outbox: true, tables.Processed: true, tables.Outbox + "_failures": true, tables.Outbox + "_parked": true, tables.Outbox + "_migrations": true, tables.Outbox + "_partitioning": true, tables.Outbox + "_id_seq": true, tables.Outbox + "_lanes": true}
	explained := 0
	for _, st := range sqltext.Registered() {
		sql := sqltext.Render(st.SQL, ids)
		switch strings.TrimSuffix(strings.Fields(sql)[0], ";") {
		case "BEGIN", "CREATE", "ALTER", "DROP", "DO", "LOCK":
			continue // a transaction opener, DDL or a block: nothing to plan
		}
		// The layout move's record exists only once a move began.
		if st.Template || (!partitioned && strings.Contains(st.SQL, "{{partitioning}}")) || strings.Contains(st.SQL, "{{layout_move}}") {
			continue
		}
		summary, accesses := explainGeneric(ctx, t, conn.Conn(), st.Name, sql)
		explained++
		checkAccesses(t, st.Name, summary, accesses, tables, tableNames, empty)
		t.Logf("%-34s %s", st.Name, summary)
	}
	require.Greater(t, explained, 30)
}

// seedPlans fills the plan test's tables.
func seedPlans(ctx context.Context, t *testing.T, db *pgtest.DB, ids sqltext.Idents) {
	for _, seed := range []string{
		`INSERT INTO {{outbox}} (aggregate_id, type, payload, dispatched_at)
		 SELECT md5((g % 500)::text)::uuid, 'order.placed', '{}', now() - interval '1 day' FROM generate_series(1, 50000) g`,
		`INSERT INTO {{outbox}} (aggregate_id, type, payload)
		 SELECT md5((g % 50)::text)::uuid, 'order.placed', '{}' FROM generate_series(1, 500) g`,
		`INSERT INTO {{failures}} (event_id, aggregate_id, type, reason, error, first_failed_at, failed_at, held_until)
		 SELECT id, aggregate_id, type, 'broker_refused', 'x', now(), now(), now() + interval '1 minute'
		 FROM {{outbox}} WHERE dispatched_at IS NULL ORDER BY id LIMIT 3`,
		`INSERT INTO {{parked}} (id, aggregate_id, type, payload, created_at, reason)
		 SELECT g, md5(g::text)::uuid, 'order.placed', '{}', now(), 'test' FROM generate_series(1000000, 1000002) g`,
		`INSERT INTO {{processed}} (consumer, source, event_id, processed_at)
		 SELECT 'loyalty', 'src', g, now() - (g || ' seconds')::interval FROM generate_series(1, 20000) g`,
		`ANALYZE {{outbox}}`, `ANALYZE {{failures}}`, `ANALYZE {{parked}}`, `ANALYZE {{processed}}`,
	} {
		_, err := db.Pool.Exec(ctx, sqltext.Render(seed, ids))
		require.NoError(t, err, seed)
	}
}

// emptyPartitions names the partitions of the outbox that hold no row.
func emptyPartitions(ctx context.Context, t *testing.T, db *pgtest.DB, tables outbox.Tables) map[string]bool {
	rows, err := db.Pool.Query(ctx, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = $1::regclass AND c.oid NOT IN (SELECT DISTINCT tableoid FROM `+tables.OutboxIdent()+`)`, tables.OutboxIdent())
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out
}

// checkAccesses checks one statement's table accesses: only this
// outbox's tables (a partition counting as the outbox table) and the
// catalog, insert-only statements reading nothing, and no sequential scan
// of the outbox by the statements that must walk an index.
func checkAccesses(t *testing.T, name, summary string, accesses []planNode, tables outbox.Tables, tableNames, empty map[string]bool) {
	var outbox []string
	for _, a := range accesses {
		rel := a.RelationName
		if strings.HasPrefix(rel, tables.Outbox+"_p0") {
			rel = tables.Outbox // a partition
		}
		if !tableNames[rel] && !strings.HasPrefix(rel, "pg_") {
			require.Fail(t, "unexpected relation", "%s reads %s, neither one of this outbox's tables nor a catalog", name, a.RelationName)
		}
		if rel == tables.Outbox && !empty[a.RelationName] {
			outbox = append(outbox, a.NodeType)
		}
	}
	if insertOnly[name] {
		for _, a := range accesses {
			require.Equal(t, "ModifyTable", a.NodeType, "%s should only insert, yet it reads %s: %s", name, a.RelationName, summary)
		}
	}
	if noOutboxSeqScan[name] {
		// A partitioned outbox's partitions may all be pruned when the
		// plan starts (the NULL parameters match none).
		if len(empty) == 0 {
			require.NotEmpty(t, outbox, "%s should read the outbox table", name)
		}
		require.NotContains(t, outbox, "Seq Scan", "%s scans the whole outbox table: %s", name, summary)
	}
}

// explainGeneric prepares sql, EXPLAINs its generic plan with every
// parameter NULL (nothing runs: no ANALYZE), in a transaction rolled back,
// and returns a one-line summary of its table accesses, and those accesses.
func explainGeneric(ctx context.Context, t *testing.T, conn *pgx.Conn, name, sql string) (string, []planNode) {
	t.Helper()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // always rolled back
	settings := "SET LOCAL plan_cache_mode = force_generic_plan"
	if strings.HasPrefix(name, "relay.claim") {
		settings += "; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"
	}
	_, err = tx.Exec(ctx, settings)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "PREPARE plan_stmt AS "+sql)
	require.NoError(t, err, "%s:\n%s", name, sql)
	var nparams int
	require.NoError(t, tx.QueryRow(ctx, "SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = 'plan_stmt'").Scan(&nparams))
	args := ""
	if nparams > 0 {
		args = "(" + strings.TrimSuffix(strings.Repeat("NULL, ", nparams), ", ") + ")"
	}
	var raw []byte
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE plan_stmt"+args).Scan(&raw), name)
	_, err = tx.Exec(ctx, "DEALLOCATE plan_stmt")
	require.NoError(t, err)
	var out []struct {
		Plan planNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &out))
	require.Len(t, out, 1)
	var accesses []planNode
	var parts []string
	out[0].Plan.walk(func(n planNode) {
		if n.RelationName == "" {
			return
		}
		accesses = append(accesses, n)
		part := n.NodeType + " " + n.RelationName
		if n.IndexName != "" {
			part += " using " + n.IndexName
		}
		parts = append(parts, part)
	})
	if len(parts) == 0 {
		return "(no table)", nil
	}
	return strings.Join(parts, "; "), accesses
}
