package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/ops/switchover"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// waitFor polls cond until it holds or d passes, and says whether it held.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// The moves of an outbox relayed from the WAL, under four producer
// goroutines (a throwaway wal_level=logical cluster):
//
//  1. the outbox goes from the polling relay to the WAL source (outbox
//     switch to-wal) while it is converted, the swap committing while the
//     slot is being created: the publication is made before the swap and
//     carried by it to the partitioned table, the slot becomes
//     consistent after it (the CI ordering that looked like a loss);
//  2. it is reverted while the WAL relayer streams;
//  3. it is converted again while the WAL relayer streams.
//
// Every committed event reaches the consumer (redeliveries allowed, as
// at-least-once), none that was not, in per-aggregate order; the WAL
// relayer never stops, and no producer's transaction fails.
func TestMovesUnderLoadWithAWALRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 16, ServerURL: opstest.NeedLogical(t, "the WAL move test")})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for ctx.Err() == nil && walrelay.Teardown(ctx, db.Pool, slot, slot) != nil {
			time.Sleep(100 * time.Millisecond)
		}
	})
	broker, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	b := &opstest.Bundle{DB: db, Broker: broker}
	poller, err := relay.New(b.RelayConfig(t, b.Client(t)))
	require.NoError(t, err)
	stopPoller := opstest.RunRelayer(t, poller)
	m, err := migrate.New(db.Tables)
	require.NoError(t, err)
	load := startLoad(t, db, 4, 40)
	load.waitEmitted(t, 300)

	// 1. The switch's setup races the convert's swap. A transaction held
	// open meanwhile keeps the slot's creation from ending (it waits for
	// the transactions open when it began); the swap waits for the
	// publication and for the slot's creation to begin, then commits,
	// and the transaction ends after it: the slot becomes consistent
	// after the swap, the publication was made before it.
	exists := func(sql string) bool {
		var ok bool
		return db.Pool.QueryRow(ctx, sql, slot).Scan(&ok) == nil && ok
	}
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, "SELECT txid_current()")
	require.NoError(t, err)
	var raced bool
	cfg := migrate.MoveConfig{Settings: migrate.PartitionSettings{Width: 100_000}, Logger: opstest.Logger(t), BeforeStep: func(step string) {
		if step == migrate.StepSwap {
			raced = waitFor(30*time.Second, func() bool {
				return exists(`SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)
  AND EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn IS NULL)`)
			})
		}
	}}
	switched := make(chan error, 1)
	go func() {
		_, err := switchover.PrepareSwitchToWAL(ctx, db.Pool, switchover.SwitchToWALConfig{Tables: db.Tables, Timeout: time.Minute})
		switched <- err
	}()
	_, err = m.Convert(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.True(t, raced, "the publication was not made, or the slot's creation had not begun, before the swap")
	require.True(t, exists(`SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn IS NULL)`),
		"the slot was consistent before the swap committed")
	require.NoError(t, holder.Rollback(ctx))
	require.NoError(t, <-switched)
	require.Equal(t, migrate.LayoutPartitioned, layoutOf(t, m, db))
	stopPoller()

	wr, err := walrelay.New(walrelay.Config{Common: relay.Common{Pool: db.Pool, Sink: kafkapub.NewPublisher(b.Client(t), kafkapub.PublisherConfig{}),
		Tables: db.Tables, ShutdownTimeout: 5 * time.Second, Logger: opstest.Logger(t)}, LeaderPollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	relayErr := make(chan error, 1)
	opstest.Start(t, func(ctx context.Context) { relayErr <- wr.Run(ctx) })
	load.waitEmitted(t, 500)
	guardHolds(t, db)

	// 2. and 3. The moves with the WAL relayer streaming across them.
	cfg.BeforeStep = nil
	_, err = m.Revert(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.Equal(t, migrate.LayoutPlain, layoutOf(t, m, db))
	load.waitEmitted(t, 500)
	guardHolds(t, db)
	_, err = m.DropRetired(ctx, db.Pool, time.Now().Add(time.Hour))
	require.NoError(t, err)
	_, err = m.Convert(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.Equal(t, migrate.LayoutPartitioned, layoutOf(t, m, db))
	load.waitEmitted(t, 500)
	load.stop()

	dups := load.checkPublished(t, broker)
	select {
	case err := <-relayErr:
		require.Failf(t, "the WAL relayer stopped during the moves", "%v", err)
	default:
	}
	require.Zero(t, wr.Stats().Dropped)
	t.Logf("%d events committed across three moves, all published in per-aggregate order; %d redeliveries (the switch's overlap)", load.count(), dups)
}
