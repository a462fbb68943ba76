package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/partition"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/migrate"
)

// A partitioned outbox (migrate.Migrator.EnablePartitioned) has its rows
// in partitions of Width ids each. An insert whose id has no partition
// fails, so partitions are made ahead of the id sequence: EnsurePartitions
// keeps enough of them for Ahead at the rate ids were drawn recently, and
// never fewer than two widths. The relay's maintenance job (ops/monitor)
// runs it every few minutes, Cleanup at its start, `outbox partitions
// ensure` on demand; the headroom it leaves is a metric, a watchdog
// finding and a log line well before it runs out.

// ErrNotPartitioned: the outbox table has the plain layout.
var ErrNotPartitioned = errors.New("ops: the outbox table is not partitioned")

// MaxPartitionsPerEnsure bounds the partitions one EnsurePartitions makes:
// a width far too narrow for the rate would otherwise make thousands (and
// every claim plans over every partition). Headroom.Low then says so.
const MaxPartitionsPerEnsure = 100

// PartitionConfig configures EnsurePartitions.
type PartitionConfig struct {
	// Tables names the outbox. Defaults to public.events_outbox.
	Tables outbox.Tables
	// Table is the partitioned table to keep partitions ahead for, in
	// Tables' schema. Defaults to Tables.Outbox; moving an outbox that
	// holds rows into the partitioned layout names its partitioned twin
	// (migrate.Migrator.CreatePartitionedTable).
	Table string
	// From is the lowest id the partitions must hold. Defaults to the id
	// the sequence hands out next; a move passes its oldest row's id.
	From int64
	// Logger receives a line per partition made, and a warning while the
	// headroom is low. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c PartitionConfig) withDefaults() PartitionConfig {
	c.Tables = c.Tables.WithDefaults()
	if c.Table == "" {
		c.Table = c.Tables.Outbox
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// PartitionRange is one partition: its table (unquoted, in the outbox's
// schema) and the ids it holds, From <= id < To.
type PartitionRange struct {
	Name string `json:"partition"`
	From int64  `json:"from"`
	To   int64  `json:"to"`
}

// Headroom is how far the partitions reach past the id sequence.
type Headroom struct {
	// NextID is the id the sequence hands out next; Top the end of the
	// last partition: ids below it have one.
	NextID, Top int64
	// IDs is Top - NextID: how many more ids can be inserted.
	IDs int64
	// Rate is the ids drawn per second recently: over the last hour of
	// rows, or since the sequence was last sampled (events written as
	// logical messages draw ids and leave no row), whichever is higher.
	Rate float64
	// Left is how long IDs last at Rate; zero when Rate is.
	Left time.Duration
	// Target is the headroom EnsurePartitions keeps: Rate over the
	// settings' Ahead, and never under two widths.
	Target int64
	// Low: IDs is under half of Target. Inserts fail once IDs reaches 0;
	// until then nothing is lost, but the job that makes partitions is
	// not keeping up (not running, not allowed to: it must own the
	// table, or a width too narrow for the rate).
	Low bool
	// Partitions counts the table's partitions.
	Partitions int
	// Width and Ahead are the settings in force.
	Width int64
	Ahead time.Duration
}

// EnsureResult is what EnsurePartitions made, and the headroom after.
type EnsureResult struct {
	Created  []PartitionRange
	Headroom Headroom
}

// EnsurePartitions makes the partitions the outbox needs ahead of its id
// sequence (Headroom.Target), up to MaxPartitionsPerEnsure, and any
// missing below it down to cfg.From. Each is one short transaction that
// takes SHARE UPDATE EXCLUSIVE on the table for an instant (producers and
// relayers go on), under the migration lock, so concurrent runs and
// migrations serialise. The role must own the outbox table (or be a
// member of its owner). It returns ErrNotPartitioned for a plain outbox.
func EnsurePartitions(ctx context.Context, db outbox.DB, cfg PartitionConfig) (EnsureResult, error) {
	var res EnsureResult
	cfg = cfg.withDefaults()
	if err := cfg.Tables.Validate(); err != nil {
		return res, err
	}
	if err := pgident.Validate("partitioned table", cfg.Table); err != nil {
		return res, fmt.Errorf("ops: %w", err)
	}
	settings, err := partitionSettings(ctx, db, cfg.Tables, cfg.Table)
	if err != nil {
		return res, err
	}
	h, parts, err := readHeadroom(ctx, db, cfg.Tables, cfg.Table, settings, true)
	if err != nil {
		return res, err
	}
	from := h.NextID
	if cfg.From > 0 {
		from = min(from, cfg.From)
	}
	for _, r := range planPartitions(parts, cfg.Tables.Outbox, from, h) {
		created, err := partition.Add(ctx, db, cfg.Tables, cfg.Table, r.From, r.To)
		if err != nil {
			return res, ownerHint(err, cfg.Tables)
		}
		if created { // else another process made it meanwhile
			res.Created = append(res.Created, r)
			h.Partitions++
			cfg.Logger.Info("created partition", "partition", r.Name, "from_id", r.From, "to_id", r.To-1)
		}
		h.Top = max(h.Top, r.To)
	}
	h.settle()
	res.Headroom = h
	if h.Low {
		cfg.Logger.Warn("partition headroom is low: inserts fail once the id sequence passes the last partition; the relay's maintenance job or 'outbox partitions ensure' makes more, as the outbox table's owner",
			"headroom_ids", h.IDs, "headroom", h.Left.Round(time.Second), "ids_per_second", math.Round(h.Rate), "target_ids", h.Target, "width", h.Width, "partitions", h.Partitions)
	}
	return res, nil
}

// planPartitions lists the partitions to add: below the lowest one down
// to from, then above the last one until the headroom reaches its target,
// MaxPartitionsPerEnsure at most. Ranges are multiples of the width from
// 0 (a width changed since keeps the old bounds and continues from the
// last one). A sequence far past the last partition (set by hand) starts
// the new ones at its position: the ids skipped were never drawn.
func planPartitions(parts []partition.Partition, outboxTable string, from int64, h Headroom) []PartitionRange {
	w := h.Width
	var out []PartitionRange
	add := func(lo, hi int64) {
		out = append(out, PartitionRange{Name: partition.Name(outboxTable, lo), From: lo, To: hi})
	}
	top := from / w * w
	if len(parts) > 0 {
		top = parts[len(parts)-1].To
		for lo := parts[0].From; lo > from && lo > 0 && len(out) < MaxPartitionsPerEnsure; lo -= w {
			add(max(lo-w, 0), lo)
		}
	}
	if h.NextID-top > MaxPartitionsPerEnsure*w {
		top = h.NextID / w * w
	}
	for top-h.NextID < h.Target && len(out) < MaxPartitionsPerEnsure {
		add(top, top+w)
		top += w
	}
	return out
}

// settle derives IDs, Left, Target and Low from the rest.
func (h *Headroom) settle() {
	h.IDs = h.Top - h.NextID
	h.Target = max(2*h.Width, int64(math.Ceil(h.Rate*h.Ahead.Seconds())))
	h.Left = 0
	if h.Rate > 0 {
		h.Left = time.Duration(float64(max(h.IDs, 0)) / h.Rate * float64(time.Second))
	}
	h.Low = h.IDs*2 < h.Target
}

// partitionSettings reads the partitioned layout's settings of the
// outbox t for its partitioned table table (the outbox table, or its twin
// during a move), or fails with ErrNotPartitioned.
func partitionSettings(ctx context.Context, db outbox.DB, t outbox.Tables, table string) (migrate.PartitionSettings, error) {
	q := pgident.Qualified(t.Schema, table)
	partitioned, err := partition.IsPartitioned(ctx, db, q)
	switch {
	case err != nil:
		return migrate.PartitionSettings{}, err
	case !partitioned:
		return migrate.PartitionSettings{}, fmt.Errorf("%w: %s is one table; make a fresh one partitioned with `outbox migrate up --partitioned`", ErrNotPartitioned, q)
	}
	return migrate.ReadPartitionSettings(ctx, db, t)
}

// readHeadroom reads the partitions of table and how far they reach past
// the sequence. With sample it also records the sequence's position
// (every hour at most) for the next call's rate.
func readHeadroom(ctx context.Context, db outbox.DB, t outbox.Tables, table string, s migrate.PartitionSettings, sample bool) (Headroom, []partition.Partition, error) {
	h := Headroom{Width: s.Width, Ahead: s.Ahead}
	parts, err := partition.List(ctx, db, pgident.Qualified(t.Schema, table))
	if err != nil {
		return h, nil, err
	}
	h.Partitions = len(parts)
	if len(parts) > 0 {
		h.Top = parts[len(parts)-1].To
	}
	if err := db.QueryRow(ctx, render(nextIDSQL, t)).Scan(&h.NextID); err != nil {
		return h, nil, fmt.Errorf("ops: read the id sequence of %s: %w", t.OutboxIdent(), err)
	}
	if h.Rate, err = idRate(ctx, db, t, h.NextID, sample); err != nil {
		return h, nil, err
	}
	h.settle()
	return h, parts, nil
}

// idRate is the ids drawn per second: over the rows of the last hour (a
// binary search of the primary key), or since the sequence was sampled,
// whichever is higher.
func idRate(ctx context.Context, db outbox.DB, t outbox.Tables, next int64, sample bool) (float64, error) {
	var now time.Time
	if err := db.QueryRow(ctx, serverNowSQL).Scan(&now); err != nil {
		return 0, fmt.Errorf("ops: read server time: %w", err)
	}
	first, err := firstIDCreatedSince(ctx, db, t, now.Add(-time.Hour))
	if err != nil {
		return 0, fmt.Errorf("ops: read the id rate of %s: %w", t.OutboxIdent(), err)
	}
	rate := float64(max(next-first, 0)) / time.Hour.Seconds()
	stmt := sampledSQL
	args := []any{}
	if sample {
		stmt, args = resampleSQL, []any{next}
	}
	var age *float64
	var id *int64
	if err := db.QueryRow(ctx, render(stmt, t), args...).Scan(&age, &id); err != nil {
		return 0, fmt.Errorf("ops: read the id sequence's last sample of %s: %w", t.OutboxIdent(), err)
	}
	if age != nil && id != nil && *age >= 60 && *id <= next {
		rate = max(rate, float64(next-*id) / *age)
	}
	return rate, nil
}

// ownerHint adds to a failure to make a partition what a role that does
// not own the outbox table must do.
func ownerHint(err error, t outbox.Tables) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return fmt.Errorf("%w (making partitions takes the role that owns %s, or a member of it: run the relay's maintenance job, or 'outbox partitions ensure' from cron, as that role)", err, t.OutboxIdent())
	}
	return err
}

// readPartitionRows reads a partition's rows by its range of the outbox:
// the created_at of its newest row (zero when it has none), its pending
// rows (the polling source's), of which held, and the parked rows whose
// ids fall in it (unparking one puts it back in this range).
func readPartitionRows(ctx context.Context, db outbox.DB, t outbox.Tables, from, to int64) (newest time.Time, pending, held, parked int64, err error) {
	var n *time.Time
	err = db.QueryRow(ctx, render(partitionRowsSQL, t), from, to).Scan(&n, &pending, &held, &parked)
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if n != nil {
		newest = *n
	}
	return newest, pending, held, parked, err
}
