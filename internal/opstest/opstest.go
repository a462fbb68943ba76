// Package opstest is what the tests of the operations packages (ops,
// ops/monitor, ops/switchover) share: a schema, a broker and a producer
// (Setup), a fast relayer, background jobs that stop with the test, and
// one throwaway wal_level=logical cluster per test binary (NeedLogical).
package opstest

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// Bundle is what an operations test needs: a schema of its own, a broker
// and a producer on the schema's outbox.
type Bundle struct {
	DB       *pgtest.DB
	Broker   *devkafka.Broker
	Producer *outbox.Producer
}

// Setup gives a Bundle on the test's own schema and broker.
func Setup(t *testing.T) *Bundle {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	b, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	return &Bundle{DB: db, Broker: b, Producer: p}
}

// Client is a publishing client on the bundle's broker.
func (b *Bundle) Client(t *testing.T) *kgo.Client {
	t.Helper()
	cl, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.Broker.Addr()},
		Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

// RelayConfig is a fast-polling relayer configuration on the bundle.
func (b *Bundle) RelayConfig(t *testing.T, cl *kgo.Client) relay.Config {
	return relay.Config{
		Common: relay.Common{Pool: b.DB.Pool, Sink: kafkapub.NewPublisher(cl, kafkapub.PublisherConfig{}), Tables: b.DB.Tables,
			BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Logger: Logger(t)},
		PollInterval: 50 * time.Millisecond,
	}
}

// Logger writes to the test's output, shown with -v or on failure.
func Logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Start runs fn in the background until the test ends (or stop is called).
func Start(t *testing.T, fn func(ctx context.Context)) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Error("background job did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// RunRelayer runs r until the test ends (or stop is called).
func RunRelayer(t *testing.T, r *relay.Relayer) (stop func()) {
	t.Helper()
	return Start(t, func(ctx context.Context) { require.NoError(t, r.Run(ctx)) })
}

// Emit commits one event in its own transaction.
func (b *Bundle) Emit(t *testing.T, agg uuid.UUID, typ string, payload any) int64 {
	t.Helper()
	var id int64
	err := pgx.BeginFunc(context.Background(), b.DB.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = b.Producer.Emit(context.Background(), tx, outbox.Event{AggregateID: agg, Type: typ, Payload: payload})
		return err
	})
	require.NoError(t, err)
	return id
}

// Exec runs sql and returns the rows it affected.
func (b *Bundle) Exec(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	tag, err := b.DB.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
	return tag.RowsAffected()
}

// Count counts the outbox rows where where holds.
func (b *Bundle) Count(t *testing.T, where string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.DB.Tables.OutboxIdent()+" WHERE "+where, args...).Scan(&n))
	return n
}

// ConsumeIDs reads every record of topics until want distinct event ids
// arrived, or fails after timeout; it returns how often each id came.
func (b *Bundle) ConsumeIDs(t *testing.T, want int, timeout time.Duration, topics ...string) map[int64]int {
	t.Helper()
	distinct := func(rs []*kgo.Record) map[int64]int {
		seen := map[int64]int{}
		for _, r := range rs {
			seen[kafkatest.EventID(r)]++
		}
		return seen
	}
	recs := kafkatest.Read(t, b.Broker.Addr(), timeout, func(rs []*kgo.Record) bool { return len(distinct(rs)) >= want }, topics...)
	seen := distinct(recs)
	require.NotContains(t, seen, int64(0), "a record without a valid event_id header")
	return seen
}

// The WAL-mode tests share one throwaway wal_level=logical cluster,
// started by the first of them (the machine's server has replica).
var (
	logicalOnce sync.Once
	logical     *tmppg.Cluster
	logicalErr  error
)

// Main runs a package's tests, then stops the shared cluster: call it
// from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if logical != nil {
		_ = logical.Stop()
	}
	os.Exit(code)
}

// NeedLogical starts the shared wal_level=logical cluster once and returns
// its URL; without one, the test (what names it) fails in CI and is
// skipped elsewhere.
func NeedLogical(t *testing.T, what string) string {
	t.Helper()
	logicalOnce.Do(func() {
		if !tmppg.Available() {
			logicalErr = errors.New("initdb and pg_ctl are not on the PATH")
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		logical, logicalErr = tmppg.Logical(ctx, 10, nil)
	})
	if logicalErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s need a throwaway wal_level=logical cluster, and none started: %v", what, logicalErr)
		}
		t.Skipf("skipped: %s need a throwaway wal_level=logical cluster (initdb/pg_ctl), and none started: %v", what, logicalErr)
	}
	return logical.URL()
}
