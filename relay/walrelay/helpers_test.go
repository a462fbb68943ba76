package walrelay_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// logical is the package's throwaway cluster with wal_level=logical; the
// machine's server has replica.
var (
	logical    *tmppg.Cluster
	logicalErr error
)

func TestMain(m *testing.M) {
	if !tmppg.Available() {
		logicalErr = fmt.Errorf("initdb and pg_ctl are not on the PATH")
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		logical, logicalErr = tmppg.Logical(ctx, 30, map[string]string{"max_connections": "150"})
		if logicalErr == nil {
			// As a deployment with message-mode producers must
			// (Config.Messages): only superusers, here the tests' role,
			// may write logical messages.
			logicalErr = secureMessages(ctx, logical.URL())
		}
		cancel()
	}
	code := m.Run()
	if logical != nil {
		_ = logical.Stop()
	}
	os.Exit(code)
}

func secureMessages(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx) //nolint:errcheck // test setup
	_, err = walrelay.SecureMessages(ctx, conn)
	return err
}

// needLogical skips (fails in CI) when no wal_level=logical cluster could
// be started, and returns its URL.
func needLogical(t testing.TB) string {
	t.Helper()
	if logicalErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the WAL relay's tests need a throwaway cluster with wal_level=logical, and none started: %v", logicalErr)
		}
		t.Skipf("skipped: the WAL relay's tests need a throwaway cluster with wal_level=logical (initdb/pg_ctl), and none started: %v", logicalErr)
	}
	return logical.URL()
}

type bundle struct {
	db       *pgtest.DB
	broker   *devkafka.Broker
	producer *outbox.Producer
	slot     string
}

func setup(t testing.TB) *bundle {
	t.Helper()
	db, slot := logicalOutbox(t)
	b, err := devkafka.Start(devkafka.Config{Partitions: 6})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	return &bundle{db: db, broker: b, producer: p, slot: slot}
}

// logicalOutbox creates an outbox in a schema of its own on the logical
// cluster, and returns it with the name of its slot (and publication),
// which is torn down when t ends, once its relayers have stopped.
func logicalOutbox(t testing.TB) (*pgtest.DB, string) {
	t.Helper()
	url := needLogical(t)
	db := pgtest.New(t, pgtest.Options{MaxConns: 16, ServerURL: url})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	t.Cleanup(func() { teardown(t, db, slot) })
	return db, slot
}

// teardown drops the slot and publication slot once the relayers let go
// of them (cleanups run in reverse: they are stopped by now).
func teardown(t testing.TB, db *pgtest.DB, slot string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if err := walrelay.Teardown(ctx, db.Pool, slot, slot); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("teardown of slot %s failed", slot)
}

func (b *bundle) relayer(t testing.TB, mod func(*walrelay.Config)) *walrelay.Relayer {
	t.Helper()
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.broker.Addr()},
		Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	cfg := walrelay.Config{
		Common:             relay.Common{Pool: b.db.Pool, Sink: kafkapub.NewPublisher(client, kafkapub.PublisherConfig{Source: "wal"}), Tables: b.db.Tables, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond},
		StatusInterval:     200 * time.Millisecond,
		LeaderPollInterval: 100 * time.Millisecond,

		Messages: true,
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := walrelay.New(cfg)
	require.NoError(t, err)
	return r
}

// run starts r; stop cancels it and waits for Run's nil.
func run(t testing.TB, r *walrelay.Relayer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("relayer did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitLeading waits until r leads.
func waitLeading(t testing.TB, r *walrelay.Relayer) {
	t.Helper()
	require.Eventually(t, func() bool { return r.Stats().Leading }, 15*time.Second, 20*time.Millisecond, "relayer never led")
}

// checkOrder checks that, per aggregate (key), the first delivery of each
// event comes in ascending id order, that every id in want arrived, and
// returns the number of duplicates.
func checkOrder(t *testing.T, recs []*kgo.Record, want map[int64]bool) int {
	t.Helper()
	seen := map[int64]bool{}
	last := map[string]int64{}
	dups := 0
	for _, r := range recs {
		id := kafkatest.EventID(r)
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		k := string(r.Key)
		require.Greater(t, id, last[k], "aggregate %s: event %d published after %d", k, id, last[k])
		last[k] = id
	}
	for id := range want {
		require.True(t, seen[id], "event %d never published", id)
	}
	return dups
}

// holdSlot sets up the outbox's slot and streams from it on a replication
// connection of its own, named appName when not empty, as another reader
// would: the slot is active until the connection closes (at the end of
// the test, or earlier by the caller).
func (b *bundle) holdSlot(t *testing.T, appName string) *pgconn.PgConn {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot))
	cfg, err := pgconn.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.RuntimeParams["replication"] = "database"
	if appName != "" {
		cfg.RuntimeParams["application_name"] = appName
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	require.NoError(t, pglogrepl.StartReplication(ctx, conn, b.slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + b.slot + "'"}}))
	return conn
}

// privateLogical starts a wal_level=logical cluster of the test's own,
// for a test that changes what is cluster-wide (privileges, a restart),
// stopped when t ends.
func privateLogical(t testing.TB) *tmppg.Cluster {
	t.Helper()
	needLogical(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := tmppg.Logical(ctx, 4, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

// setupOn is setup on the server at url, whose slot is not torn down (the
// server is the test's own).
func setupOn(t testing.TB, url string) *bundle {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 16, ServerURL: url})
	b, err := devkafka.Start(devkafka.Config{Partitions: 6})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	return &bundle{db: db, broker: b, producer: p, slot: walrelay.DefaultNameOf(db.Pool, db.Tables)}
}
