package ops

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay"
)

// Execer runs a statement; *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// maxErrorLen caps a recorded error: enough for any broker or relayer
// message, bounded in case a publisher quotes a payload.
const maxErrorLen = 2000

// FailureRecorder copies a relayer's held-out failures (relay.Relayer.Held:
// the last permanent error of each aggregate it holds out) into the
// failures table (migrate.FailuresIdent), so that `outbox watchdog`, run
// anywhere, can say why a row is stuck. The relayer keeps them in memory
// only; BatchResult does not carry per-row errors.
//
// Each replica records what it saw; a failure is written once per attempt
// (the relayer retries a held-out row after its HoldOut), so the table
// holds the latest error and the number of attempts recorded.
type FailureRecorder struct {
	db     Execer
	held   func() []relay.Failure
	log    *slog.Logger
	upsert string
	wake   chan struct{}

	mu      sync.Mutex
	written map[int64]time.Time // event id -> failure time already written
}

// recordSQL upserts failures; an older attempt (from a slower replica)
// never overwrites a newer one.
const recordSQL = `INSERT INTO {{failures}} AS f (event_id, aggregate_id, type, error, first_failed_at, failed_at)
SELECT id, agg, typ, err, at, at
FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::timestamptz[]) AS u(id, agg, typ, err, at)
ON CONFLICT (event_id) DO UPDATE
  SET error = EXCLUDED.error, failed_at = EXCLUDED.failed_at, attempts = f.attempts + 1
  WHERE f.failed_at < EXCLUDED.failed_at`

// NewFailureRecorder records the failures held returns (usually
// (*relay.Relayer).Held) into tables' failures table through db.
func NewFailureRecorder(db Execer, tables outbox.Tables, held func() []relay.Failure, log *slog.Logger) *FailureRecorder {
	if log == nil {
		log = slog.Default()
	}
	return &FailureRecorder{
		db: db, held: held, log: log,
		upsert:  render(recordSQL, tables.WithDefaults()),
		wake:    make(chan struct{}, 1),
		written: map[int64]time.Time{},
	}
}

// Notify asks Run to record soon. It never blocks: call it from the
// relayer's OnBatch when a batch had permanent failures.
func (f *FailureRecorder) Notify() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Record writes the failures not written yet.
func (f *FailureRecorder) Record(ctx context.Context) error {
	held := f.held()
	f.mu.Lock()
	var ids []int64
	var aggs, types, errs []string
	var ats []time.Time
	current := make(map[int64]bool, len(held))
	for _, h := range held {
		current[h.EventID] = true
		if f.written[h.EventID].Equal(h.At) {
			continue
		}
		msg := h.Err
		if len(msg) > maxErrorLen {
			msg = msg[:maxErrorLen] + "..."
		}
		ids = append(ids, h.EventID)
		aggs = append(aggs, h.AggregateID.String())
		types = append(types, h.Type)
		errs = append(errs, msg)
		ats = append(ats, h.At)
	}
	// Forget rows no longer held, so the map stays as small as Held().
	for id := range f.written {
		if !current[id] {
			delete(f.written, id)
		}
	}
	f.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	if _, err := f.db.Exec(ctx, f.upsert, ids, aggs, types, errs, ats); err != nil {
		return fmt.Errorf("ops: record %d publish failures: %w", len(ids), err)
	}
	f.mu.Lock()
	for i, id := range ids {
		f.written[id] = ats[i]
	}
	f.mu.Unlock()
	return nil
}

// Run records on every Notify, and every interval as a fallback, until ctx
// is cancelled.
func (f *FailureRecorder) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		case <-t.C:
		}
		if err := f.Record(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("could not record publish failures for the watchdog; will retry", "err", err)
		}
	}
}
