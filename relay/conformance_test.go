package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/sourcetest"
)

// The polling relay passes the shared order, crash and poison scenarios
// (relay/sourcetest), which the WAL source passes too.
func TestConformance(t *testing.T) {
	t.Parallel()
	sourcetest.Run(t, pollingSource())
}

// The polling relay passes the suite on a partitioned outbox too (the
// partitioned layout), its events spread over several partitions.
func TestConformancePartitioned(t *testing.T) {
	t.Parallel()
	src := pollingSource()
	src.Name = "poll, partitioned"
	src.Open = func(t *testing.T) *sourcetest.DB {
		return (*sourcetest.DB)(pgtest.New(t, pgtest.Options{MaxConns: 16, Partitioned: true, PartitionWidth: 5000, PartitionedIDs: 100_000}))
	}
	sourcetest.Run(t, src)
}

// pollingSource plugs the polling relay into the shared suite: the
// machine's server, relayers that share the outbox, poison rows held in
// the failures table with their aggregates waiting behind them.
func pollingSource() sourcetest.Source {
	return sourcetest.Source{
		Name: "poll",
		Open: func(t *testing.T) *sourcetest.DB { return sourcetest.NewDB(t, "") },
		Start: func(t *testing.T, db *sourcetest.DB, pub relay.Sink, cfg sourcetest.RelayerConfig) *sourcetest.Relayer {
			t.Helper()
			// A pool of its own, whose sessions (its LISTEN connection
			// included: it copies the pool's config) Kill can find.
			app := "relay_test_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
			pcfg, err := pgxpool.ParseConfig(db.URL)
			require.NoError(t, err)
			pcfg.MaxConns = 4
			pcfg.ConnConfig.RuntimeParams["application_name"] = app
			pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			rc := relay.Config{
				Common:       relay.Common{Pool: pool, Sink: pub, Tables: db.Tables, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond, BatchSize: cfg.BatchSize, Logger: cfg.Logger, Contracts: cfg.Contracts},
				PollInterval: 50 * time.Millisecond,

				HoldOut: cfg.HoldOut,
			}
			r, err := relay.New(rc)
			require.NoError(t, err)
			return sourcetest.Background(t, db, r.Run, []string{app}, func() sourcetest.Stats {
				s := r.Stats()
				return sourcetest.Stats{Published: s.Dispatched, FailedBatches: s.FailedBatches}
			})
		},
		Unacked: func(t *testing.T, db *sourcetest.DB) []int64 {
			t.Helper()
			rows, err := db.Pool.Query(context.Background(), "SELECT id FROM "+db.Tables.OutboxIdent()+" WHERE dispatched_at IS NULL ORDER BY id")
			require.NoError(t, err)
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			require.NoError(t, err)
			return ids
		},
		Sidelined: func(t *testing.T, db *sourcetest.DB) map[int64]sourcetest.Sidelined {
			t.Helper()
			// A hold on a row that is no longer pending (parked, published
			// by a retry) holds nothing.
			rows, err := db.Pool.Query(context.Background(), `SELECT f.event_id, f.reason, f.error, f.attempts FROM `+migrate.FailuresIdent(db.Tables)+` f
				JOIN `+db.Tables.OutboxIdent()+` o ON o.id = f.event_id WHERE o.dispatched_at IS NULL`)
			require.NoError(t, err)
			out := map[int64]sourcetest.Sidelined{}
			var (
				id int64
				s  sourcetest.Sidelined
			)
			_, err = pgx.ForEachRow(rows, []any{&id, &s.Reason, &s.Err, &s.Attempts}, func() error {
				out[id] = s
				return nil
			})
			require.NoError(t, err)
			return out
		},
		Holds:          true,
		Replicas:       sourcetest.Share,
		AcksEachBatch:  true,
		CheckSidelined: checkWatchdog,
	}
}

// checkWatchdog: the watchdog sees held rows at once (not after
// StuckAfter), each with its reason and last error, and lists the rows
// behind one as blocked by it.
func checkWatchdog(t *testing.T, db *sourcetest.DB, poison map[int64]string, behind map[int64]int64) {
	t.Helper()
	held := map[string]int64{}
	for _, reason := range poison {
		held[reason]++
	}
	check := func(c assert.TestingT) {
		rep, err := ops.Check(context.Background(), db.Pool, ops.WatchdogConfig{Tables: db.Tables, Limit: 10_000})
		if !assert.NoError(c, err) {
			return
		}
		assert.Equal(c, int64(len(poison)), rep.Held, "held rows")
		assert.Equal(c, held, rep.HeldByReason, "held rows by reason")
		assert.Equal(c, int64(len(poison)+len(behind)), rep.Lag.Stuck, "stuck rows: the held ones and those behind them")
		assert.Len(c, rep.Stuck, len(poison)+len(behind))
		for _, s := range rep.Stuck {
			if head, ok := behind[s.ID]; ok {
				assert.Equal(c, head, s.BlockedBy, "row %d waits for its aggregate's held row", s.ID)
				assert.Empty(c, s.Reason, "row %d behind a held row has no failure of its own", s.ID)
				continue
			}
			assert.Equal(c, poison[s.ID], s.Reason, "row %d", s.ID)
			assert.NotEmpty(c, s.LastError, "row %d", s.ID)
			assert.Zero(c, s.BlockedBy, "row %d", s.ID)
		}
	}
	// A short HoldOut lets a hold lapse between retries: wait for a moment
	// the watchdog sees it.
	require.EventuallyWithT(t, func(c *assert.CollectT) { check(c) }, 10*time.Second, 20*time.Millisecond)
}
