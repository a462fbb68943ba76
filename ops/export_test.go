package ops

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
)

// WALHorizon and CleanupWALAt split a WAL-mode cleanup at its horizon, so
// a test can commit a row between the two.
func WALHorizon(ctx context.Context, db outbox.DB) (lsn string, xmin int64, err error) {
	h, err := readWALHorizon(ctx, db)
	return h.lsn, h.xmin, err
}

func CleanupWALAt(ctx context.Context, pool *pgxpool.Pool, cfg CleanupConfig, lsn string, xmin int64) (TableCleanup, error) {
	var tc TableCleanup
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return tc, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return tc, err
	}
	defer conn.Release()
	var cutoff, unused time.Time
	if err := conn.QueryRow(ctx, cleanupCutoffsSQL, cfg.Retention.Microseconds(), cfg.Retention.Microseconds()).Scan(&cutoff, &unused); err != nil {
		return tc, err
	}
	err = cleanupOutboxWAL(ctx, conn.Conn(), cfg, cfg.Logger, cutoff, walHorizon{lsn, xmin}, &tc)
	return tc, err
}
