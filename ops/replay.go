package ops

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
)

// DefaultReplayChunk is how many ids of the primary key Replay looks at
// per transaction.
const DefaultReplayChunk = 10_000

// ReplayConfig says which dispatched events Replay sets back to pending.
type ReplayConfig struct {
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// FromID and ToID bound the range of ids, both included. Required.
	FromID, ToID int64
	// Type, when set, replays only events of this type.
	Type string
	// AggregateID, when set, replays only events of this aggregate.
	AggregateID uuid.UUID
	// ChunkSize is how many rows of the primary key one transaction looks
	// at. At most 1000000. Defaults to DefaultReplayChunk (10,000).
	ChunkSize int
	// Apply replays them; otherwise Replay only counts them. Defaults to
	// false: a dry run.
	Apply bool
	// Logger receives the Info line of an applied run. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c ReplayConfig) WithDefaults() ReplayConfig {
	c.Tables = c.Tables.WithDefaults()
	if c.ChunkSize == 0 {
		c.ChunkSize = DefaultReplayChunk
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports a bad table name, id range or ChunkSize.
func (c ReplayConfig) Validate() error {
	if err := c.Tables.Validate(); err != nil {
		return err
	}
	switch {
	case c.FromID <= 0 || c.ToID <= 0:
		return fmt.Errorf("ops: replay needs a range of ids, from %d to %d: both ends are positive ids, and both are included", c.FromID, c.ToID)
	case c.FromID > c.ToID:
		return fmt.Errorf("ops: replay range from %d to %d is inverted: the first id must not be above the last", c.FromID, c.ToID)
	case c.ChunkSize < 0 || c.ChunkSize > 1_000_000:
		return fmt.Errorf("ops: replay ChunkSize is %d; use 1 to 1000000, or 0 for the default %d", c.ChunkSize, DefaultReplayChunk)
	}
	return nil
}

// ReplayResult is what Replay did, or would do.
type ReplayResult struct {
	// Applied is false for a dry run.
	Applied bool
	// Rows counts the rows replayed (or that would be); FirstID and LastID
	// are the lowest and highest of their ids, 0 when none.
	Rows, FirstID, LastID int64
	// Pending counts rows of the range matching the filters that were
	// pending already: they are left as they are.
	Pending int64
	// Chunks is the number of transactions an applied run committed.
	Chunks int
	// OldestID is the lowest id left in the outbox (0 when it is empty):
	// dispatched rows below it were deleted by retention cleanup and cannot
	// be replayed.
	OldestID int64
}

// Replay sets dispatched events with ids in [FromID, ToID] (and the Type
// and AggregateID, when set) back to pending, so that the relayers publish
// them again, e.g. for a new consumer; consumers deduplicate by event_id.
// It works in windows of ChunkSize rows of the primary key, each its own
// transaction that NOTIFYs the relayers, never in one large update. Each
// replayed row's requeued_at becomes now(), and its created_at stays: the
// lag, the stuck-row watchdog and the commit-to-publish latency measure
// how long it has waited for the replay, not its age; a failure record
// left from its earlier life is deleted.
//
// Rows deleted by retention cleanup cannot be replayed (OldestID says
// where the outbox starts). Events of one aggregate are replayed in id
// order, but an event emitted while a replay runs can reach the broker
// between two chunks' replayed events of its aggregate.
//
// When ctx is cancelled between chunks, Replay returns what it did so far
// and ctx's error; every finished chunk stays committed.
func Replay(ctx context.Context, db outbox.DB, cfg ReplayConfig) (ReplayResult, error) {
	res := ReplayResult{Applied: cfg.Apply}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	t := cfg.Tables
	var typ, agg any // NULL: any
	if cfg.Type != "" {
		typ = cfg.Type
	}
	if cfg.AggregateID != uuid.Nil {
		agg = cfg.AggregateID
	}
	log := cfg.Logger.With("outbox", t.OutboxIdent())

	if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, render(oldestIDSQL, t)).Scan(&res.OldestID); err != nil {
			return err
		}
		if cfg.Apply {
			return nil
		}
		return tx.QueryRow(ctx, render(replayCountSQL, t), cfg.FromID, cfg.ToID, typ, agg).Scan(&res.Rows, &res.Pending, &res.FirstID, &res.LastID)
	}); err != nil {
		return res, fmt.Errorf("ops: replay: count rows %d to %d of %s: %w", cfg.FromID, cfg.ToID, t.OutboxIdent(), err)
	}
	if !cfg.Apply {
		return res, nil
	}

	q := render(replaySQL, t)
	from := cfg.FromID
	for {
		ch, err := replayChunk(ctx, db, t, q, from, cfg, typ, agg)
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			logReplay(log, cfg, res)
			return res, replayStopped(cfg, res, from, err)
		}
		res.Chunks++
		res.Rows += ch.replayed
		res.Pending += ch.pending
		if ch.replayed > 0 {
			if res.FirstID == 0 {
				res.FirstID = ch.first
			}
			res.LastID = ch.last
		}
		if ch.scanned < int64(cfg.ChunkSize) || ch.lastSeen >= cfg.ToID {
			break
		}
		from = ch.lastSeen + 1
		if ctx.Err() != nil {
			logReplay(log, cfg, res)
			return res, replayStopped(cfg, res, from, ctx.Err())
		}
	}
	logReplay(log, cfg, res)
	return res, nil
}

// replayedChunk is what one chunk of Replay did.
type replayedChunk struct {
	replayed, first, last, pending, scanned, lastSeen int64
}

// replayChunk replays the matching dispatched rows among the next
// cfg.ChunkSize ids from from, in a transaction of its own that NOTIFYs
// the relayers when it replayed any.
func replayChunk(ctx context.Context, db outbox.DB, t outbox.Tables, q string, from int64, cfg ReplayConfig, typ, agg any) (replayedChunk, error) {
	var ch replayedChunk
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, q, from, cfg.ToID, cfg.ChunkSize, typ, agg).Scan(&ch.replayed, &ch.first, &ch.last, &ch.pending, &ch.scanned, &ch.lastSeen); err != nil {
			return err
		}
		if ch.replayed > 0 {
			if _, err := tx.Exec(ctx, notifySQL, t.Channel()); err != nil {
				return fmt.Errorf("notify the relayers: %w", err)
			}
		}
		return nil
	})
	return ch, err
}

// replayStopped is the error of a Replay that stopped at id from: what
// stays replayed and how to finish.
func replayStopped(cfg ReplayConfig, res ReplayResult, from int64, err error) error {
	return fmt.Errorf("ops: replay stopped at id %d of %d to %d after %d rows in %d chunks (those stay replayed; "+
		"to finish, replay from id %d): %w", from, cfg.FromID, cfg.ToID, res.Rows, res.Chunks, from, err)
}

func logReplay(log *slog.Logger, cfg ReplayConfig, res ReplayResult) {
	if res.Rows == 0 {
		return // nothing changed
	}
	args := []any{"verb", "replay", "from_id", cfg.FromID, "to_id", cfg.ToID, "replayed", res.Rows,
		"first_id", res.FirstID, "last_id", res.LastID, "chunks", res.Chunks}
	if cfg.Type != "" {
		args = append(args, "type", cfg.Type)
	}
	if cfg.AggregateID != uuid.Nil {
		args = append(args, "aggregate_id", cfg.AggregateID)
	}
	log.Info("replayed dispatched outbox events: set back to pending for the relayers to publish again", args...)
}
