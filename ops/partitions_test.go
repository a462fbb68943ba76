package ops_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// partitionedDB is a test's outbox in the partitioned layout with
// partitions of width ids, made for the first 20 widths.
func partitionedDB(t *testing.T, width int64) *pgtest.DB {
	t.Helper()
	return pgtest.New(t, pgtest.Options{MaxConns: 6, Partitioned: true, PartitionWidth: width, PartitionedIDs: 20 * width})
}

func partitionNames(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	ps, err := partition.List(context.Background(), db.Pool, db.Tables.OutboxIdent())
	require.NoError(t, err)
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

func exec(t *testing.T, db *pgtest.DB, sql string, args ...any) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err, sql)
}

// Retention drops the partitions whose rows are all dispatched and older
// than the retention, and only those: one with a pending row, one with a
// held row and one with a parked row's id are kept and reported (in the
// result, the recorded run, the watchdog's problems), young and open ones
// are not due.
func TestPartitionRetentionDropsOnlyDispatchedOldPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := partitionedDB(t, 100)
	day := 24 * time.Hour
	fill(t, db, 549, 10*day, 10*day, 0)       // ids 1-549, in partitions p0 to p500: old and dispatched
	fill(t, db, 100, time.Hour, time.Hour, 0) // ids 550-649: young
	ob := db.Tables.OutboxIdent()
	exec(t, db, "UPDATE "+ob+" SET dispatched_at = NULL WHERE id = 150")         // p100: pending
	exec(t, db, "UPDATE "+ob+" SET dispatched_at = NULL WHERE id IN (250, 260)") // p200: held
	exec(t, db, `INSERT INTO `+db.Tables.Schema+`.events_outbox_failures (event_id, aggregate_id, type, reason, error, first_failed_at, failed_at, held_until)
		SELECT id, aggregate_id, type, 'too_large', 'too big', now(), now(), now() + interval '1 hour' FROM `+ob+` WHERE id = 250`)
	exec(t, db, `WITH moved AS (DELETE FROM `+ob+` WHERE id = 350 RETURNING *)
		INSERT INTO `+db.Tables.Schema+`.events_outbox_parked (id, aggregate_id, type, payload, created_at, reason)
		SELECT id, aggregate_id, type, payload, created_at, 'test' FROM moved`) // p300: a parked id

	infos, h, err := ops.ListPartitions(ctx, db.Pool, ops.PartitionListConfig{Tables: db.Tables, Retention: day})
	require.NoError(t, err)
	require.Equal(t, int64(650), h.NextID)
	why := map[int64]string{}
	for _, in := range infos {
		why[in.From] = in.Reason
		if in.Droppable {
			why[in.From] = "droppable"
		}
	}
	require.Equal(t, map[int64]string{0: "droppable", 100: ops.KeptPending, 200: ops.KeptHeld, 300: ops.KeptParked, 400: "droppable", 500: "", 600: ""},
		subset(why, 0, 100, 200, 300, 400, 500, 600), "p500 holds young rows, p600 is open")

	res, err := ops.Cleanup(ctx, db.Pool, ops.CleanupConfig{Tables: db.Tables, Retention: day, SkipProcessed: true})
	require.NoError(t, err)
	require.NotNil(t, res.Partitions)
	var dropped []int64
	for _, d := range res.Partitions.Dropped {
		dropped = append(dropped, d.From)
	}
	require.Equal(t, []int64{0, 400}, dropped)
	kept := map[int64]string{}
	for _, k := range res.Partitions.Kept {
		kept[k.From] = k.Reason
	}
	require.Equal(t, map[int64]string{100: ops.KeptPending, 200: ops.KeptHeld, 300: ops.KeptParked}, kept)
	require.Zero(t, res.Outbox.Deleted, "no row is deleted one by one")

	var left, pending int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE dispatched_at IS NULL) FROM "+ob).Scan(&left, &pending))
	require.Equal(t, 649-200, left, "the rows of p0 (99) and p400 (100) are gone, and id 350 is parked")
	require.Equal(t, 3, pending)
	require.NotContains(t, partitionNames(t, db), db.Tables.Outbox+"_p0000000000000000000")

	st, err := ops.ReadPartitionStatus(ctx, db.Pool, db.Tables)
	require.NoError(t, err)
	require.NotNil(t, st.LastRetention)
	require.Len(t, st.LastRetention.Kept, 3)
	require.Len(t, st.Problems(), 2, "the pending and held partitions are problems, the parked one is not: %v", st.Problems())
	rep, err := ops.Check(ctx, db.Pool, ops.WatchdogConfig{Tables: db.Tables})
	require.NoError(t, err)
	require.False(t, rep.Healthy())
}

func subset(m map[int64]string, keys ...int64) map[int64]string {
	out := map[int64]string{}
	for _, k := range keys {
		out[k] = m[k]
	}
	return out
}

// waitDetaching waits until a DETACH PARTITION ... CONCURRENTLY of the
// outbox waits for a transaction to end.
func waitDetaching(t *testing.T, db *pgtest.DB) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE query LIKE 'ALTER TABLE %DETACH PARTITION%CONCURRENTLY' AND query LIKE '%'||$1||'%' AND wait_event_type = 'Lock'`, db.Tables.Schema).Scan(&n))
		return n > 0
	}, 30*time.Second, 20*time.Millisecond, "the cleanup never waited in DETACH CONCURRENTLY")
}

// An insert that drew its id inside a partition and had not committed when
// the partition looked all dispatched is not lost: the detach waits for
// it, the check after the detach finds its row pending, and the partition
// is attached back with the row, reported as kept (in_flight).
func TestPartitionRetentionKeepsAPartitionWithAnInsertInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := partitionedDB(t, 100)
	ob := db.Tables.OutboxIdent()
	inflight, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer inflight.Rollback(ctx) //nolint:errcheck // committed below
	var id int64
	require.NoError(t, inflight.QueryRow(ctx, "INSERT INTO "+ob+" (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'order.placed', '{}') RETURNING id").Scan(&id))
	require.Equal(t, int64(1), id, "the in-flight row is in the first partition")
	day := 24 * time.Hour
	fill(t, db, 250, 10*day, 10*day, 0) // ids 2-251: the rest of p0 and p100, old and dispatched

	type result struct {
		res ops.CleanupResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := ops.Cleanup(ctx, db.Pool, ops.CleanupConfig{Tables: db.Tables, Retention: day, SkipProcessed: true})
		done <- result{res, err}
	}()
	waitDetaching(t, db)
	require.NoError(t, inflight.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.Len(t, r.res.Partitions.Dropped, 1)
	require.Equal(t, int64(100), r.res.Partitions.Dropped[0].From, "p100 had no late row")
	require.Len(t, r.res.Partitions.Kept, 1)
	require.Equal(t, ops.KeptInFlight, r.res.Partitions.Kept[0].Reason)
	require.Equal(t, int64(0), r.res.Partitions.Kept[0].From)

	var pending bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT dispatched_at IS NULL FROM "+ob+" WHERE id = 1").Scan(&pending))
	require.True(t, pending, "the late row is in the outbox, pending")
	require.Contains(t, partitionNames(t, db), db.Tables.Outbox+"_p0000000000000000000", "attached back")
}

// A cleanup whose session dies while its DETACH CONCURRENTLY waits leaves
// the partition detach-pending (queries of the outbox no longer see it);
// the next one finishes the detach, checks the partition and drops it,
// and says so.
func TestPartitionRetentionFinishesAnInterruptedDetach(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := partitionedDB(t, 100)
	ob := db.Tables.OutboxIdent()
	day := 24 * time.Hour
	fill(t, db, 350, 10*day, 10*day, 0) // ids 1-350: p0, p100, p200 due; p300 open
	reader, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer reader.Rollback(ctx) //nolint:errcheck // ended below
	_, err = reader.Exec(ctx, "SELECT count(*) FROM "+ob)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := ops.Cleanup(ctx, db.Pool, ops.CleanupConfig{Tables: db.Tables, Retention: day, SkipProcessed: true})
		done <- err
	}()
	waitDetaching(t, db)
	// Its session dies mid-detach, as with the process killed.
	exec(t, db, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE query LIKE 'ALTER TABLE %DETACH PARTITION%CONCURRENTLY' AND query LIKE '%'||$1||'%'`, db.Tables.Schema)
	require.Error(t, <-done)
	require.NoError(t, reader.Rollback(ctx))
	ps, err := partition.List(ctx, db.Pool, ob)
	require.NoError(t, err)
	require.True(t, ps[0].DetachPending, "the first partition is left detach-pending")
	var before int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+ob).Scan(&before))
	require.Equal(t, 350-99, before, "queries no longer see the detach-pending partition's rows")

	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	var res ops.CleanupResult
	require.Eventually(t, func() bool {
		// The stopped cleanup's session lets go of the cleanup lock
		// when it ends.
		res, err = ops.Cleanup(ctx, db.Pool, ops.CleanupConfig{Tables: db.Tables, Retention: day, SkipProcessed: true, Logger: log})
		return !errors.Is(err, ops.ErrCleanupRunning)
	}, 30*time.Second, 50*time.Millisecond, "the stopped cleanup's lock was never let go")
	require.NoError(t, err)
	require.Equal(t, []string{ps[0].Name}, res.Partitions.Finished)
	require.Len(t, res.Partitions.Dropped, 3, "p0 (finished), p100 and p200")
	require.Contains(t, logs.String(), "finishing the detach of a partition that an earlier cleanup began and did not finish")
	var left int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+ob).Scan(&left))
	require.Equal(t, 51, left, "p300's rows: ids 300 to 350")
	p, err := migrate.ReadPartitioning(ctx, db.Pool, db.Tables)
	require.NoError(t, err)
	require.Zero(t, p.Detaching, "the record of the detach is cleared")
}

// A partition a run detached and was killed before dropping is a table of
// its own that queries of the outbox no longer see: the next run checks
// it and drops it, or, when a row in it is pending (a replay raced the
// detach), attaches it back.
func TestPartitionRetentionSettlesAPartitionLeftDetached(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := partitionedDB(t, 100)
	ob := db.Tables.OutboxIdent()
	day := 24 * time.Hour
	fill(t, db, 250, 10*day, 10*day, 0) // ids 1-250: p0 and p100 due
	exec(t, db, "UPDATE "+ob+" SET dispatched_at = NULL WHERE id = 150")
	for _, name := range []string{"p0000000000000000000", "p0000000000000000100"} {
		exec(t, db, "ALTER TABLE "+ob+" DETACH PARTITION "+db.Tables.Schema+"."+db.Tables.Outbox+"_"+name+" CONCURRENTLY")
	}
	record := func(name string, from int64) {
		exec(t, db, "UPDATE "+db.Tables.Schema+"."+db.Tables.Outbox+"_partitioning SET detaching = $1, detaching_from = $2, detaching_to = $3", db.Tables.Outbox+"_"+name, from, from+100)
	}

	record("p0000000000000000000", 0)
	res, err := ops.Cleanup(ctx, db.Pool, ops.CleanupConfig{Tables: db.Tables, Retention: day, SkipProcessed: true})
	require.NoError(t, err)
	require.Equal(t, []string{db.Tables.Outbox + "_p0000000000000000000"}, res.Partitions.Finished)
	require.Equal(t, int64(0), res.Partitions.Dropped[0].From)
	require.NotContains(t, partitionNames(t, db), db.Tables.Outbox+"_p0000000000000000000")

	record("p0000000000000000100", 100)
	res, err = ops.Cleanup(ctx, db.Pool, ops.CleanupConfig{Tables: db.Tables, Retention: day, SkipProcessed: true})
	require.NoError(t, err)
	require.Empty(t, res.Partitions.Dropped)
	require.Equal(t, ops.KeptInFlight, res.Partitions.Kept[0].Reason, "the pending row keeps it")
	require.Contains(t, partitionNames(t, db), db.Tables.Outbox+"_p0000000000000000100", "attached back")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+ob+" WHERE id BETWEEN 100 AND 199").Scan(&n))
	require.Equal(t, 100, n, "every row of it is back")
}

// setAhead records how long the partitions made ahead should last.
func setAhead(t *testing.T, db *pgtest.DB, ahead time.Duration) {
	t.Helper()
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	_, err = m.EnablePartitioned(context.Background(), db.Pool, migrate.PartitionSettings{Ahead: ahead})
	require.NoError(t, err)
}

// Partitions are made ahead of the id sequence for Ahead at the recent
// rate, never fewer than two widths; under that headroom, kept by the
// maintenance job between bursts of inserts, no insert meets a missing
// partition. Without the job the headroom runs low, which the watchdog
// reports before inserts fail.
func TestEnsurePartitionsKeepsInsertsFromMissingPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4, Partitioned: true, PartitionWidth: 100, PartitionedIDs: 1})
	setAhead(t, db, time.Hour)
	cfg := ops.PartitionConfig{Tables: db.Tables}
	res, err := ops.EnsurePartitions(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.Empty(t, res.Created, "a fresh table has its two widths ahead")
	require.Equal(t, int64(200), res.Headroom.Target)
	require.False(t, res.Headroom.Low)

	insert := func(n int64) error {
		_, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload) SELECT gen_random_uuid(), 'order.placed', '{}' FROM generate_series(1, $1::bigint)", n)
		return err
	}
	// Each round uses every id the headroom holds, as a burst at the
	// rate it was sized for would between two runs of the job.
	var inserted int64
	for round := range 5 {
		h := res.Headroom
		require.NoError(t, insert(h.IDs), "round %d: %d rows, the headroom the last ensure left", round, h.IDs)
		inserted += h.IDs
		res, err = ops.EnsurePartitions(ctx, db.Pool, cfg)
		require.NoError(t, err)
		h = res.Headroom
		require.GreaterOrEqual(t, h.IDs, h.Target, "round %d", round)
		require.GreaterOrEqual(t, h.Target, inserted, "an hour at the last hour's rate is what was inserted within it")
		require.False(t, h.Low)
	}
	require.Greater(t, inserted, int64(3000), "the headroom grew with the rate")
	h := res.Headroom
	require.NoError(t, insert(h.IDs))
	require.ErrorContains(t, insert(1), "no partition of relation", "one id past the headroom: what the job is there to prevent")

	st, err := ops.ReadPartitionStatus(ctx, db.Pool, db.Tables)
	require.NoError(t, err)
	require.True(t, st.Headroom.Low, "%+v", st.Headroom)
	require.Len(t, st.Problems(), 1)
	require.Contains(t, st.Problems()[0], "partition headroom is low")
	rep, err := ops.Check(ctx, db.Pool, ops.WatchdogConfig{Tables: db.Tables})
	require.NoError(t, err)
	require.False(t, rep.Healthy(), "low headroom is a watchdog finding")
}

// Ids drawn without rows (logical-message events draw from the sequence
// too) count in the rate: the sequence's position is sampled.
func TestEnsurePartitionsCountsIDsDrawnWithoutRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4, Partitioned: true, PartitionWidth: 1000, PartitionedIDs: 1})
	setAhead(t, db, time.Hour)
	cfg := ops.PartitionConfig{Tables: db.Tables}
	_, err := ops.EnsurePartitions(ctx, db.Pool, cfg)
	require.NoError(t, err)
	exec(t, db, "SELECT nextval('"+db.Tables.Schema+"."+db.Tables.Outbox+"_id_seq') FROM generate_series(1, 6000)")
	exec(t, db, "UPDATE "+db.Tables.Schema+"."+db.Tables.Outbox+"_partitioning SET sampled_at = sampled_at - interval '10 minutes'")
	res, err := ops.EnsurePartitions(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.InDelta(t, 10, res.Headroom.Rate, 0.5, "6,000 ids in ten minutes")
	// An hour at 10 ids/s; the sample is a moment more than ten minutes
	// old by the time it is read, so the rate is a hair under 10.
	require.GreaterOrEqual(t, res.Headroom.IDs, int64(35_900), "an hour at 10 ids/s")
	require.NotEmpty(t, res.Created)
}

// With the WAL source (rows never marked dispatched) a due partition is
// dropped only once the slot confirmed a WAL position after the detach,
// after every transaction that wrote it; a slot that does not confirm
// keeps every partition (slot_behind), which the watchdog reports.
func TestPartitionRetentionWaitsForTheSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 6, ServerURL: opstest.NeedLogical(t, "the WAL-mode partition tests"), Partitioned: true, PartitionWidth: 100, PartitionedIDs: 1000})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	require.NoError(t, walrelay.Setup(ctx, db.Pool, db.Tables, slot, slot))
	t.Cleanup(func() { _ = walrelay.Teardown(context.Background(), db.Pool, slot, slot) })
	var viaRoot bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pubviaroot FROM pg_publication WHERE pubname = $1", slot).Scan(&viaRoot))
	require.True(t, viaRoot, "a partitioned outbox's publication publishes its partitions' inserts as its own")
	day := 24 * time.Hour
	fill(t, db, 250, 10*day, -1, 0) // ids 1-250, never marked dispatched: p0 and p100 due
	cfg := ops.CleanupConfig{Tables: db.Tables, Retention: day, Source: ops.WAL(slot), WALConfirmWait: 300 * time.Millisecond, SkipProcessed: true, Logger: opstest.Logger(t)}

	res, err := ops.Cleanup(ctx, db.Pool, cfg)
	require.ErrorIs(t, err, ops.ErrSlotBehind)
	require.Empty(t, res.Partitions.Dropped)
	require.Len(t, res.Partitions.Kept, 2)
	require.Equal(t, ops.KeptSlotBehind, res.Partitions.Kept[0].Reason)
	rep, err := ops.Check(ctx, db.Pool, ops.WatchdogConfig{Tables: db.Tables, Source: ops.WAL(slot)})
	require.NoError(t, err)
	require.False(t, rep.Healthy())
	require.Len(t, rep.Partitions.Problems(), 2)

	stop := opstest.Start(t, func(ctx context.Context) {
		for ctx.Err() == nil {
			_, _ = db.Pool.Exec(ctx, `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, slot)
			time.Sleep(20 * time.Millisecond)
		}
	})
	cfg.WALConfirmWait = time.Minute
	res, err = ops.Cleanup(ctx, db.Pool, cfg)
	stop()
	require.NoError(t, err)
	require.Len(t, res.Partitions.Dropped, 2)
	var left int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Tables.OutboxIdent()).Scan(&left))
	require.Equal(t, 51, left, "p200's rows: ids 200 to 250")
}

// The seam a move of an outbox holding rows into the partitioned layout
// uses: a partitioned twin of the (plain) outbox table under another name,
// with the layout's settings (migrate.Migrator.CreatePartitionedTable),
// given partitions from the oldest row's id on by EnsurePartitions, takes
// the outbox's rows, inserts (ids from the same sequence) and guard.
func TestPartitionedTwinForAMove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	fill(t, db, 150, time.Hour, time.Hour, 0) // the plain outbox holds ids 1-150
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	twin := db.Tables.Outbox + "_next"
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return m.CreatePartitionedTable(ctx, tx, twin, migrate.PartitionSettings{Width: 100, Ahead: time.Hour})
	}))
	res, err := ops.EnsurePartitions(ctx, db.Pool, ops.PartitionConfig{Tables: db.Tables, Table: twin, From: 1})
	require.NoError(t, err)
	require.Equal(t, int64(0), res.Created[0].From, "from the oldest row on")
	require.GreaterOrEqual(t, res.Headroom.IDs, int64(150), "an hour at the rate of the outbox's last hour of rows")

	twinQ := db.Tables.Schema + "." + twin
	// The copy keeps the rows' ids, which the guard refuses from a
	// producer: a move copies with the triggers off.
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+twinQ+" SELECT * FROM "+db.Tables.OutboxIdent())
		return err
	}))
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+twinQ).Scan(&n))
	require.Equal(t, 150, n)
	exec(t, db, "INSERT INTO "+twinQ+" (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'order.placed', '{}')")
	_, err = db.Pool.Exec(ctx, "INSERT INTO "+twinQ+" (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'bad topic', '{}')")
	require.ErrorContains(t, err, "holds a character Kafka refuses", "the guard came along")
	p, err := m.Partitioning(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrate.LayoutPlain, p.Layout, "the outbox table itself is untouched")
}
