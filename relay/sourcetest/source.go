package sourcetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/relay"
)

// DB is one scenario's outbox: a fresh, migrated outbox in a schema of its
// own on a server the source can read. Build it with NewDB.
type DB struct {
	// Pool is connected to the server; its search_path starts with the
	// outbox's schema.
	Pool *pgxpool.Pool
	// Tables names the outbox's tables.
	Tables outbox.Tables
	// URL connects as Pool does.
	URL string
}

// NewDB creates a fresh outbox in a schema of its own on the server at
// serverURL (DATABASE_URL, else the local test server, when ""), migrated,
// with a pool of up to 16 connections, and drops it when t ends.
func NewDB(t *testing.T, serverURL string) *DB {
	t.Helper()
	return (*DB)(pgtest.New(t, pgtest.Options{MaxConns: 16, ServerURL: serverURL}))
}

// Source is one relay source as the suite drives it. Every field but
// CheckSidelined is required.
type Source struct {
	// Name names the source in the suite's messages.
	Name string
	// EventSource is the event_source header the source's publishers set
	// ("" for none). The suite builds the publishers (on its own broker,
	// wrapped when a scenario injects a crash) and checks that every
	// record read back carries it.
	EventSource string
	// Open creates a fresh outbox in a schema of its own on a server the
	// source can read (NewDB), dropped when t ends. Events written right after
	// Open returns, before any relayer starts, must be relayed (the WAL
	// source creates its slot here).
	Open func(t *testing.T) *DB
	// Start starts one relayer on db's outbox that publishes through pub,
	// until t ends or the Relayer is stopped or killed: build it with
	// Background.
	Start func(t *testing.T, db *DB, pub relay.Sink, cfg RelayerConfig) *Relayer
	// Unacked lists, ascending, the events the source would publish (again)
	// if a relayer started now: the pending rows (polling), the inserts the
	// slot holds past its confirmed position (WAL). The suite calls it once
	// the outbox's relayers have stopped, and while they run only for a
	// source that Holds.
	Unacked func(t *testing.T, db *DB) []int64
	// Sidelined reads, by event id, the events the source set aside
	// because it cannot publish them, from where an operator finds them:
	// the holds on pending rows in the failures table (polling), the
	// parked table (WAL).
	Sidelined func(t *testing.T, db *DB) map[int64]Sidelined
	// Holds is true when the source keeps an event it cannot publish
	// pending, held, and tries it again after a backoff, its aggregate's
	// later events waiting behind it (polling: order is kept, the
	// aggregate stalls until an operator acts); false when it sets the
	// event aside once and publishes its aggregate's later events without
	// it (WAL: the stream goes on).
	Holds bool
	// CommitOrder is true when the source publishes an aggregate's events
	// in commit order whatever ids they drew (WAL), so the writers also
	// commit plain INSERTs that take no per-aggregate lock; false when it
	// relies on the producers' per-aggregate lock to make id order the
	// commit order (polling).
	CommitOrder bool
	// Replicas says how several relayers on one outbox share it.
	Replicas Replicas
	// AcksEachBatch is true when a batch the broker acknowledged is
	// acknowledged to the outbox before the next batch is published
	// (polling: marked in its own transaction); a crash then leaves
	// exactly the crashed batch to be sent again. False when
	// acknowledgements may trail (WAL: the slot is told at intervals).
	AcksEachBatch bool
	// CheckSidelined, when set, runs in the poison scenarios once the
	// shared assertions passed, with the relayers still running, for what
	// only this source promises. poison is the reason each poison event
	// was set aside for; behind maps each event that must wait behind a
	// poison event (a source that Holds) to that event.
	CheckSidelined func(t *testing.T, db *DB, poison map[int64]string, behind map[int64]int64)
	// KnownDefects maps the name of a scenario the source fails to what
	// fails: Run skips it with "known defect: ...", so the suite stays
	// green while the finding is open and the entry says what to remove
	// once it is fixed. Defaults to none.
	KnownDefects map[string]string
}

// Replicas is how several relayers on one outbox share it.
type Replicas int

const (
	// Share: every relayer claims and publishes batches side by side.
	Share Replicas = iota
	// Lead: one relayer publishes, the others stand by to take over.
	Lead
)

// RelayerConfig is what a scenario sets on the relayers it starts; zero
// values mean the source's test defaults.
type RelayerConfig struct {
	// BatchSize is the most events one publish takes.
	BatchSize int
	// HoldOut is how long a source that Holds waits before it tries a
	// held event again; others ignore it.
	HoldOut time.Duration
	// Logger receives the relayer's logs.
	Logger *slog.Logger
	// Contracts are the relayer's event contracts (relay.Common.Contracts);
	// nil: none.
	Contracts outbox.Contracts
}

// Sidelined is an event a source set aside because it cannot publish it.
type Sidelined struct {
	// Reason is one of relay's Reason constants.
	Reason string
	// Err is the error recorded with it.
	Err string
	// Attempts counts the failures recorded (a held event is tried again;
	// a parked one failed once).
	Attempts int
}

// Stats are a relayer's counters the scenarios read.
type Stats struct {
	// Published events the broker acknowledged through this relayer.
	Published int64
	// FailedBatches counts publish attempts that failed and backed off.
	FailedBatches int64
}

// Relayer is one relayer a scenario started.
type Relayer struct {
	t      *testing.T
	db     *DB
	apps   []string
	stats  func() Stats
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// Background runs run (a relayer's Run) until t ends or the returned
// Relayer is stopped. apps are the application_names of the relayer's own
// database sessions, which Kill terminates; stats reads its counters.
func Background(t *testing.T, db *DB, run func(context.Context) error, apps []string, stats func() Stats) *Relayer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Relayer{t: t, db: db, apps: apps, stats: stats, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- run(ctx) }()
	t.Cleanup(r.Stop)
	return r
}

// Stop cancels the relayer's Run and waits for it to return nil: a
// graceful stop, which lets the batch in flight finish.
func (r *Relayer) Stop() {
	if err := r.stop(); err != nil {
		r.t.Error(err)
	}
}

// stop is Stop, returning what went wrong; only the first call reports.
func (r *Relayer) stop() error {
	var err error
	r.once.Do(func() {
		r.cancel()
		select {
		case runErr := <-r.done:
			if runErr != nil {
				err = fmt.Errorf("relayer Run returned %q; want nil on stop", runErr)
			}
		case <-time.After(30 * time.Second):
			err = errors.New("relayer did not stop within 30s")
		}
	})
	return err
}

// Kill ends the relayer as kill -9 of its process would: its database
// sessions are terminated, whatever they were doing, then its Run is
// cancelled, without waiting for it (Stop waits). It may be called from
// inside the relayer's Sink.
func (r *Relayer) Kill() {
	n, err := terminate(r.db, r.apps...)
	if err != nil {
		r.t.Errorf("kill relayer: %v", err)
	} else if n == 0 {
		r.t.Errorf("kill relayer: no session named %q", r.apps)
	}
	r.cancel()
}

// Stats reads the relayer's counters.
func (r *Relayer) Stats() Stats { return r.stats() }

// terminate ends every session on db's server named one of apps and waits
// until they are gone, so that the next statement on their connections
// fails for certain. It returns how many it ended.
func terminate(db *DB, apps ...string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Materialized first: in a plain WHERE, Postgres may call
	// pg_terminate_backend on rows before the other conditions rule them
	// out.
	rows, err := db.Pool.Query(ctx, `WITH victims AS MATERIALIZED (
  SELECT pid FROM pg_stat_activity WHERE application_name = ANY($1) AND pid <> pg_backend_pid()
) SELECT pid FROM victims WHERE pg_terminate_backend(pid)`, apps)
	if err != nil {
		return 0, err
	}
	var pids []int32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			rows.Close()
			return 0, err
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&n); err != nil {
			return len(pids), err
		}
		if n == 0 {
			return len(pids), nil
		}
		select {
		case <-ctx.Done():
			return len(pids), ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// check fails t when src lacks a required field.
func (src Source) check(t *testing.T) {
	t.Helper()
	require.NotEmpty(t, src.Name, "Source.Name")
	require.NotNil(t, src.Open, "Source.Open of %s", src.Name)
	require.NotNil(t, src.Start, "Source.Start of %s", src.Name)
	require.NotNil(t, src.Unacked, "Source.Unacked of %s", src.Name)
	require.NotNil(t, src.Sidelined, "Source.Sidelined of %s", src.Name)
}
