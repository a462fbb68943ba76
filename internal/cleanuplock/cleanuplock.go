// Package cleanuplock is the session lock that lets one retention cleanup
// of an outbox run at a time (package ops), and that a switch between
// sources takes so that no cleanup deletes rows under it (package
// ops/switchover).
package cleanuplock

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/lockkey"
)

// TryLock takes the outbox's cleanup lock on a connection of its own,
// without waiting: locked is false (and conn nil) when another session
// holds it. unlock releases the lock and gives the connection back.
func TryLock(ctx context.Context, pool *pgxpool.Pool, t outbox.Tables) (conn *pgxpool.Conn, unlock func(), locked bool, err error) {
	conn, err = pool.Acquire(ctx)
	if err != nil {
		return nil, nil, false, fmt.Errorf("ops: cleanup: connect: %w", err)
	}
	ns := lockkey.Cleanup(t.Schema, t.Outbox)
	if err := conn.QueryRow(ctx, lockSQL, ns, lockkey.CleanupID).Scan(&locked); err != nil {
		conn.Release()
		return nil, nil, false, fmt.Errorf("ops: cleanup: take the cleanup lock: %w", err)
	}
	if !locked {
		conn.Release()
		return nil, nil, false, nil
	}
	return conn, func() {
		// A session lock outlives the borrow: release it before the
		// connection goes back to the pool, or close the connection.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, unlockSQL, ns, lockkey.CleanupID); err != nil {
			_ = conn.Hijack().Close(uctx)
			return
		}
		conn.Release()
	}, true, nil
}
