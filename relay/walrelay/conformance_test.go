package walrelay_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/sourcetest"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// `outbox relay --mode wal` passes the order, crash and poison scenarios
// the polling relay passes (relay/sourcetest).
func TestConformance(t *testing.T) {
	t.Parallel()
	needLogical(t)
	sourcetest.Run(t, walSource())
}

// The WAL source passes the suite on a partitioned outbox too (the
// partitioned layout): its publication publishes the partitions' inserts
// as the outbox's.
func TestConformancePartitioned(t *testing.T) {
	t.Parallel()
	url := needLogical(t)
	src := walSource()
	src.Name = "wal, partitioned"
	src.Open = func(t *testing.T) *sourcetest.DB {
		t.Helper()
		db := pgtest.New(t, pgtest.Options{MaxConns: 16, ServerURL: url, Partitioned: true, PartitionWidth: 5000, PartitionedIDs: 100_000})
		slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
		t.Cleanup(func() { teardown(t, db, slot) })
		require.NoError(t, walrelay.Setup(context.Background(), db.Pool, db.Tables, slot, slot))
		return (*sourcetest.DB)(db)
	}
	sourcetest.Run(t, src)
}

// walSource plugs the WAL source into the shared suite: the logical
// cluster, one leader and standbys, commit order whatever the ids, poison
// events parked.
func walSource() sourcetest.Source {
	return sourcetest.Source{
		Name:        "wal",
		EventSource: "wal",
		Open: func(t *testing.T) *sourcetest.DB {
			t.Helper()
			db, slot := logicalOutbox(t)
			// The slot exists before the first event: what is committed
			// before it is not in it.
			require.NoError(t, walrelay.Setup(context.Background(), db.Pool, db.Tables, slot, slot))
			return (*sourcetest.DB)(db)
		},
		Start: func(t *testing.T, db *sourcetest.DB, pub relay.Sink, cfg sourcetest.RelayerConfig) *sourcetest.Relayer {
			t.Helper()
			name := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
			r, err := walrelay.New(walrelay.Config{
				Common:             relay.Common{Pool: db.Pool, Sink: pub, Tables: db.Tables, BatchSize: cfg.BatchSize, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Logger: cfg.Logger, Contracts: cfg.Contracts},
				StatusInterval:     200 * time.Millisecond,
				LeaderPollInterval: 100 * time.Millisecond,

				Name: name,
			})
			require.NoError(t, err)
			// Its own sessions: the leader lock's and the stream's
			// (relayer.go's appName).
			apps := []string{"outbox-wal leader " + name, "outbox-wal stream " + name}
			return sourcetest.Background(t, db, r.Run, apps, func() sourcetest.Stats {
				s := r.Stats()
				return sourcetest.Stats{Published: s.Dispatched, FailedBatches: s.FailedBatches}
			})
		},
		Unacked:     slotInserts,
		Sidelined:   parkedEvents,
		Holds:       false,
		CommitOrder: true,
		Replicas:    sourcetest.Lead,
	}
}

// slotInserts lists the ids of the outbox inserts the slot still holds
// past its confirmed position: what the next leader would publish. It
// decodes the slot's changes without consuming them
// (pg_logical_slot_peek_binary_changes, pgoutput), once the stream of the
// last relayer has released the slot.
func slotInserts(t *testing.T, db *sourcetest.DB) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	for {
		ids, err := peekInserts(ctx, db, slot)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" && ctx.Err() == nil { // object_in_use: a stream still ending
			time.Sleep(50 * time.Millisecond)
			continue
		}
		require.NoError(t, err, "peek at slot %s", slot)
		return ids
	}
}

func peekInserts(ctx context.Context, db *sourcetest.DB, slot string) ([]int64, error) {
	rows, err := db.Pool.Query(ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, 'proto_version', '1', 'publication_names', $2)`, slot, slot)
	if err != nil {
		return nil, err
	}
	idCol := map[uint32]int{} // the outbox's relation ids, to the position of its id column
	var ids []int64
	var data []byte
	_, err = pgx.ForEachRow(rows, []any{&data}, func() error {
		msg, err := pglogrepl.Parse(data)
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pglogrepl.RelationMessage:
			if m.Namespace != db.Tables.Schema || m.RelationName != db.Tables.Outbox {
				return nil
			}
			for i, c := range m.Columns {
				if c.Name == "id" {
					idCol[m.RelationID] = i
				}
			}
		case *pglogrepl.InsertMessage:
			i, ok := idCol[m.RelationID]
			if !ok {
				return nil
			}
			id, err := strconv.ParseInt(string(m.Tuple.Columns[i].Data), 10, 64)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(ids)
	return ids, nil
}

// parkedEvents reads the parked table, where the WAL source moves the
// events it cannot publish (reason "wal relay: <reason>").
func parkedEvents(t *testing.T, db *sourcetest.DB) map[int64]sourcetest.Sidelined {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT id, reason, coalesce(last_error, '') FROM `+migrate.ParkedIdent(db.Tables))
	require.NoError(t, err)
	out := map[int64]sourcetest.Sidelined{}
	var (
		id           int64
		reason, last string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &reason, &last}, func() error {
		code, ok := strings.CutPrefix(reason, "wal relay: ")
		if !ok {
			return errors.New("parked event " + strconv.FormatInt(id, 10) + " has reason " + strconv.Quote(reason) + ", not one the WAL source writes")
		}
		out[id] = sourcetest.Sidelined{Reason: code, Err: last, Attempts: 1}
		return nil
	})
	require.NoError(t, err)
	return out
}
