package demo_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/demo"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/kafka"
)

// The demo's own invariants are the test: every committed order's event
// delivered and applied once, nothing from rolled-back orders, forced
// redeliveries skipped, points exact.
func TestDemoRunsAndEveryInvariantHolds(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	rep, err := demo.Run(context.Background(), demo.Config{
		DatabaseURL: pgtest.URL(), Orders: 200, Writers: 4, Redeliver: 25, Out: &out, Progress: true,
		Timeout: 90 * time.Second,
	})
	require.NoError(t, err, out.String())
	rep.Print(&out)
	t.Log("\n" + out.String())
	require.True(t, rep.OK(), "failures: %v", rep.Failures)
	require.Equal(t, int64(200), rep.OrdersAttempted)
	require.Equal(t, int64(20), rep.OrdersRolledBack, "every 10th order reuses an id")
	require.Equal(t, int64(180), rep.OrdersCommitted)
	require.Equal(t, rep.OrdersCommitted, rep.EventsInOutbox)
	require.Equal(t, rep.OrdersCommitted, rep.Consumed)
	require.Equal(t, int64(25), rep.Redelivered)
	require.GreaterOrEqual(t, rep.DuplicatesSkipped, int64(25))
	require.Equal(t, rep.Points.Expected, rep.Points.Awarded)
	require.Contains(t, out.String(), "all invariants hold")
	require.Contains(t, out.String(), "loyalty points")
	require.Contains(t, out.String(), "dispatch lag")

	// The schema is gone afterwards.
	require.NotEmpty(t, rep.Schema)
	var n int
	pool := pgtest.New(t, pgtest.Options{NoMigrate: true}).Pool
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_namespace WHERE nspname = $1", rep.Schema).Scan(&n))
	require.Zero(t, n, "demo must drop its schema")
}

// With no database reachable and no way to start one, the demo fails with
// an error that says what to do.
func TestDemoUnreachableDatabaseSaysWhatToDo(t *testing.T) {
	t.Parallel()
	_, err := demo.Run(context.Background(), demo.Config{DatabaseURL: "postgres://nobody@127.0.0.1:1/x?connect_timeout=2", NoThrowaway: true, Timeout: 20 * time.Second})
	require.Error(t, err)
	require.Contains(t, err.Error(), "does not answer")
	require.Contains(t, err.Error(), "DATABASE_URL")
}

// On a machine where no server answers, the demo starts a throwaway
// cluster (as the postgres user when run by root) and removes it after.
func TestDemoStartsThrowawayClusterWhenNoServerAnswers(t *testing.T) {
	t.Parallel()
	if !tmppg.Available() {
		if os.Getenv("CI") == "true" {
			t.Fatal("initdb/pg_ctl not on PATH in CI")
		}
		t.Skip("initdb and pg_ctl are not on the PATH")
	}
	var out bytes.Buffer
	rep, err := demo.Run(context.Background(), demo.Config{
		DatabaseURL: "postgres://nobody@127.0.0.1:1/x?connect_timeout=2", Orders: 60, Writers: 2, Redeliver: 5, Out: &out,
		Timeout: 90 * time.Second,
	})
	require.NoError(t, err, out.String())
	require.True(t, rep.OK(), "failures: %v", rep.Failures)
	require.Contains(t, out.String(), "starting a throwaway cluster")
	require.Contains(t, rep.Database, "127.0.0.1")
}

// On a cluster given by Brokers (here the dev broker, as `outbox demo
// --brokers` would reach it) the demo deletes the topics it used, unless
// KeepSchema.
func TestDemoOnExternalBrokerDeletesItsTopics(t *testing.T) {
	t.Parallel()
	b, err := devkafka.Start(devkafka.Config{})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	topics := func() []string {
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
		require.NoError(t, err)
		defer cl.Close()
		ts, err := kadm.NewClient(cl).ListTopics(context.Background())
		require.NoError(t, err)
		return ts.Names()
	}
	run := func(keep bool) demo.Report {
		var out bytes.Buffer
		rep, err := demo.Run(context.Background(), demo.Config{
			DatabaseURL: pgtest.URL(), Brokers: kafka.ClientConfig{Brokers: []string{b.Addr()}},
			Orders: 30, Writers: 2, Redeliver: 3, Out: &out, Timeout: 90 * time.Second, KeepSchema: keep,
		})
		require.NoError(t, err, out.String())
		require.True(t, rep.OK(), "failures: %v\n%s", rep.Failures, out.String())
		if keep {
			require.NotContains(t, out.String(), "deleted the demo's topics")
		} else {
			require.Contains(t, out.String(), "deleted the demo's topics "+rep.Schema+".order, "+rep.Schema+".order.dlq")
			require.Contains(t, out.String(), "deleted the demo's consumer group loyalty-"+rep.Schema)
		}
		return rep
	}

	groups := func() []string {
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
		require.NoError(t, err)
		defer cl.Close()
		gs, err := kadm.NewClient(cl).ListGroups(context.Background())
		require.NoError(t, err)
		return gs.Groups()
	}

	rep := run(false)
	require.Empty(t, topics(), "the demo left topics behind")
	require.Empty(t, groups(), "the demo left its consumer group behind")

	rep = run(true)
	require.ElementsMatch(t, []string{rep.Schema + ".order", rep.Schema + ".order.dlq"}, topics())
	require.Equal(t, []string{"loyalty-" + rep.Schema}, groups(), "--keep keeps the consumer group")
	pool := pgtest.New(t, pgtest.Options{NoMigrate: true}).Pool
	_, err = pool.Exec(context.Background(), "DROP SCHEMA "+rep.Schema+" CASCADE")
	require.NoError(t, err)
}

// The demo reports the server it used, once it answered.
func TestDemoReportsTheDatabaseItUsed(t *testing.T) {
	t.Parallel()
	var got []string
	rep, err := demo.Run(context.Background(), demo.Config{
		DatabaseURL: pgtest.URL(), Orders: 20, Writers: 2, Redeliver: 2, Timeout: 90 * time.Second,
		OnConnect: func(c *pgconn.Config) {
			got = append(got, fmt.Sprintf("%s:%d/%s as %s", c.Host, c.Port, c.Database, c.User))
		},
	})
	require.NoError(t, err)
	require.Equal(t, []string{rep.Database}, got)
}
