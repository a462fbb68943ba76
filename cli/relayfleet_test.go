package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/migrate"
)

// startConfigRelay runs `outbox relay --config FILE args...` in-process,
// FILE holding yaml, until stop or the end of the test.
func startConfigRelay(t *testing.T, yaml string, args ...string) *background {
	t.Helper()
	b := &background{done: make(chan error, 1)}
	root := NewRoot(&b.stdout, &b.stderr)
	root.SetArgs(append([]string{"relay", "--config", writeConfig(t, yaml)}, args...))
	ctx, cancel := context.WithCancel(context.Background())
	go func() { b.done <- root.ExecuteContext(ctx) }()
	var once sync.Once
	var err error
	b.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-b.done:
			case <-time.After(60 * time.Second):
				err = errors.New("the relay did not stop within 60s of cancellation")
			}
			if err != nil || t.Failed() {
				t.Logf("outbox relay stderr:\n%s", b.stderr.String())
			}
		})
		return err
	}
	t.Cleanup(func() { _ = b.stop() })
	return b
}

// needTmppg skips t where no throwaway cluster can start (fails it in CI).
func needTmppg(t *testing.T) {
	t.Helper()
	if !tmppg.Available() {
		if os.Getenv("CI") == "true" {
			t.Fatal("initdb and pg_ctl are not on the PATH; CI must run this test")
		}
		t.Skip("skipped: needs a throwaway Postgres cluster (initdb/pg_ctl on the PATH)")
	}
}

// emitTo commits n events of typ into tables through pool.
func emitTo(t *testing.T, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, tables outbox.Tables, typ string, n int) error {
	t.Helper()
	p, err := outbox.NewProducer(outbox.Config{Tables: tables})
	require.NoError(t, err)
	ctx := context.Background()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := range n {
			if _, err := p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: typ, Payload: map[string]int{"n": i}}); err != nil {
				return err
			}
		}
		return nil
	})
}

func pendingOf(t *testing.T, db *pgtest.DB, tables outbox.Tables) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+tables.OutboxIdent()+" WHERE dispatched_at IS NULL").Scan(&n))
	return n
}

// tryGet is get for a server that may not listen yet.
func tryGet(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// outboxesState reads /outboxes: each outbox's state, by name.
func outboxesState(t *testing.T, base string) map[string]outboxStatus {
	t.Helper()
	_, body := get(t, base+"/outboxes")
	var list []outboxStatus
	require.NoError(t, json.Unmarshal([]byte(body), &list), body)
	out := map[string]outboxStatus{}
	for _, s := range list {
		out[s.Name] = s
	}
	return out
}

// One relay process serves four outboxes from a config file: two
// schemas of one database (three polling outboxes, one to NATS) and a
// WAL outbox on another server (a throwaway wal_level=logical cluster),
// Kafka for the others, through one client. Everything is relayed; the
// three polling outboxes of one database share one LISTEN connection
// (their poll interval is an hour, so only its notifications wake them);
// /metrics labels each outbox's metrics with its name, and has the
// process's own once; /readyz and /outboxes show each outbox running.
func TestRelayConfigManyOutboxes(t *testing.T) {
	t.Parallel()
	needTmppg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	cluster, err := tmppg.Logical(ctx, 4, nil)
	cancel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	walDB := pgtest.New(t, pgtest.Options{MaxConns: 4, ServerURL: cluster.URL()})
	shop, billing := pgtest.New(t), pgtest.New(t)
	payments := outbox.Tables{Schema: billing.Tables.Schema, Outbox: "payments_outbox"}.WithDefaults()
	m, err := migrate.New(payments)
	require.NoError(t, err)
	_, err = m.Up(context.Background(), billing.Pool)
	require.NoError(t, err)
	broker, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	natstest.AddStream(t, js, jetstream.StreamConfig{Name: "PAYMENTS", Subjects: []string{"pay.>"}})

	app := "multirelay_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	local := shop.URL + "&application_name=" + app
	addr := kafkatest.FreeAddr(t)
	b := startConfigRelay(t, fmt.Sprintf(`brokers: %s
poll-interval: 1h
cleanup-interval: 0
outboxes:
  - name: shop
    database-url: %s
    schema: %s
  - database-url: %s
    schema: %s
  - name: payments
    database-url: %s
    schema: %s
    table: payments_outbox
    sink: %s
    topic-prefix: pay.
  - name: shipping
    database-url: %s
    schema: %s
    mode: wal
    linger: 0
`, broker.Addr(), local, shop.Tables.Schema, local, billing.Tables.Schema, local, billing.Tables.Schema, srv.URL(), walDB.URL, walDB.Tables.Schema), "--http", addr)
	base := "http://" + addr
	billingName := billing.Tables.Schema + ".events_outbox@test"

	require.Eventually(t, func() bool {
		code, _, err := tryGet(base + "/readyz")
		return err == nil && code == 200
	}, 60*time.Second, 50*time.Millisecond, "the outboxes did not all start: %s", b.stderr.String())
	_, ready := get(t, base+"/readyz")
	for _, name := range []string{"shop", billingName, "payments", "shipping"} {
		require.Contains(t, ready, name+": ok\n")
	}

	// The WAL outbox's events are those committed once its slot exists:
	// its leader creates it.
	require.Eventually(t, func() bool {
		s := outboxesState(t, base)["shipping"].Stats
		return s != nil && s.Leading != nil && *s.Leading
	}, 60*time.Second, 50*time.Millisecond, "the WAL outbox does not lead its slot")
	require.NoError(t, emitTo(t, shop.Pool, shop.Tables, "order.placed", 5))
	require.NoError(t, emitTo(t, billing.Pool, billing.Tables, "invoice.sent", 6))
	require.NoError(t, emitTo(t, billing.Pool, payments, "payment.captured", 7))
	require.NoError(t, emitTo(t, walDB.Pool, walDB.Tables, "shipment.sent", 8))

	for _, o := range []struct {
		db     *pgtest.DB
		tables outbox.Tables
	}{{shop, shop.Tables}, {billing, billing.Tables}, {billing, payments}} {
		require.Eventually(t, func() bool { return pendingOf(t, o.db, o.tables) == 0 }, 30*time.Second, 20*time.Millisecond,
			"%s: not relayed; a poll interval of an hour leaves it to the shared LISTEN to wake it", o.tables.OutboxIdent())
	}
	require.Len(t, kafkatest.Collect(t, broker.Addr(), 5, 30*time.Second, "order"), 5)
	require.Len(t, kafkatest.Collect(t, broker.Addr(), 6, 30*time.Second, "invoice"), 6)
	require.Len(t, kafkatest.Collect(t, broker.Addr(), 8, 30*time.Second, "shipment"), 8, "the WAL outbox's events")
	require.Eventually(t, func() bool { return len(natstest.ReadStream(t, js, "PAYMENTS", "pay.payment.captured")) == 7 }, 30*time.Second, 100*time.Millisecond)

	var listeners int
	require.NoError(t, shop.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'", app).Scan(&listeners))
	require.Equal(t, 1, listeners, "the three polling outboxes of one database share one LISTEN connection")

	require.Eventually(t, func() bool {
		_, metrics := get(t, base+"/metrics")
		return strings.Contains(metrics, `outbox_events_dispatched_total{outbox="shop",topic="order"} 5`+"\n") &&
			strings.Contains(metrics, `outbox_events_dispatched_total{outbox="`+billingName+`",topic="invoice"} 6`+"\n") &&
			strings.Contains(metrics, `outbox_events_dispatched_total{outbox="payments",topic="pay.payment.captured"} 7`+"\n") &&
			strings.Contains(metrics, `outbox_events_dispatched_total{outbox="shipping"} 8`+"\n")
	}, 20*time.Second, 50*time.Millisecond, "/metrics does not count each outbox's events under its label")
	_, metrics := get(t, base+"/metrics")
	require.Contains(t, metrics, `outbox_wal_leader{outbox="shipping"} 1`)
	require.Contains(t, metrics, `outbox_relay_running{outbox="payments"} 1`)
	require.Equal(t, 1, strings.Count(metrics, "\ngo_goroutines "), "the process's own metrics once")

	state := outboxesState(t, base)
	require.Len(t, state, 4)
	for name, s := range state {
		require.Equal(t, "running", s.State, name)
		require.NotNil(t, s.Stats, name)
	}
	require.Equal(t, int64(7), state["payments"].Stats.Dispatched)
	require.True(t, *state["shipping"].Stats.Leading)
	require.NoError(t, b.stop())
}

// One relay process serves four outboxes, and one's trouble is its own:
// an outbox whose server never answers keeps retrying while the others
// run; one whose rows are held relays its other aggregates; and while
// one's server is down, the others' events still arrive. Once that server
// is back, its outbox relays again.
func TestRelayConfigIsolatesOutboxes(t *testing.T) {
	t.Parallel()
	needTmppg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	cluster, err := tmppg.Start(ctx)
	cancel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	private := pgtest.New(t, pgtest.Options{MaxConns: 2, ServerURL: cluster.URL()})
	healthy, held := pgtest.New(t), pgtest.New(t)
	broker, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	for range 50 {
		held.InsertLegacy(t, uuid.New(), "order.placed", "'{}'", `'{"retries": 3}'`)
	}

	addr := kafkatest.FreeAddr(t)
	b := startConfigRelay(t, fmt.Sprintf(`brokers: %s
poll-interval: 100ms
hold-out: 10m
cleanup-interval: 0
outboxes:
  - name: private
    database-url: %s
    schema: %s
  - name: healthy
    database-url: %s
    schema: %s
  - name: held
    database-url: %s
    schema: %s
  - name: never
    database-url: postgres://postgres@%s/none?sslmode=disable&connect_timeout=2
`, broker.Addr(), private.URL, private.Tables.Schema, healthy.URL, healthy.Tables.Schema, held.URL, held.Tables.Schema, kafkatest.FreeAddr(t)), "--http", addr)
	base := "http://" + addr

	// The outbox whose server never answers retries; the process goes on.
	require.Eventually(t, func() bool {
		_, _, err := tryGet(base + "/outboxes")
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "the relay does not serve --http")
	require.Eventually(t, func() bool {
		s := outboxesState(t, base)["never"]
		return s.State != "running" && strings.Contains(s.Error, "connection refused") && s.Restarts > 0
	}, 30*time.Second, 50*time.Millisecond, "the unreachable outbox does not show its failure in /outboxes")
	code, ready := get(t, base+"/readyz")
	require.Equal(t, 503, code)
	require.Contains(t, ready, "never: not ready:")

	// The others relay, the held outbox its other aggregates.
	require.NoError(t, emitTo(t, private.Pool, private.Tables, "order.placed", 3))
	require.NoError(t, emitTo(t, healthy.Pool, healthy.Tables, "order.placed", 3))
	require.NoError(t, emitTo(t, held.Pool, held.Tables, "order.placed", 3))
	for _, db := range []*pgtest.DB{private, healthy} {
		require.Eventually(t, func() bool { return pendingOf(t, db, db.Tables) == 0 }, 30*time.Second, 20*time.Millisecond, db.Tables.Schema)
	}
	require.Eventually(t, func() bool { return pendingOf(t, held, held.Tables) == 50 }, 30*time.Second, 20*time.Millisecond,
		"the held outbox's other aggregates are not relayed")

	// One server down: the outbox on it is not ready; the others relay.
	require.NoError(t, cluster.Down(context.Background()))
	require.Eventually(t, func() bool {
		code, body := get(t, base+"/readyz?outbox=private")
		return code == 503 && strings.Contains(body, "private: not ready:")
	}, 30*time.Second, 50*time.Millisecond, "/readyz does not see the private outbox's server down")
	require.NoError(t, emitTo(t, healthy.Pool, healthy.Tables, "order.placed", 4))
	require.NoError(t, emitTo(t, held.Pool, held.Tables, "order.placed", 4))
	require.Eventually(t, func() bool {
		return pendingOf(t, healthy, healthy.Tables) == 0 && pendingOf(t, held, held.Tables) == 50
	},
		30*time.Second, 20*time.Millisecond, "the other outboxes stopped relaying while one server is down")
	code, _ = get(t, base+"/readyz?outbox=private")
	require.Equal(t, 503, code, "the private server is still down while the others relayed")
	code, ready = get(t, base+"/readyz?outbox=healthy")
	require.Equal(t, 200, code, ready)

	// Back up: its outbox relays again.
	ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, cluster.Up(ctx))
	require.Eventually(t, func() bool { return emitTo(t, private.Pool, private.Tables, "order.placed", 2) == nil }, 30*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool { return pendingOf(t, private, private.Tables) == 0 }, 60*time.Second, 50*time.Millisecond,
		"the private outbox does not relay again once its server is back")
	require.GreaterOrEqual(t, len(kafkatest.Collect(t, broker.Addr(), 3+3+3+4+4+2, 30*time.Second, "order")), 3+3+3+4+4+2)
	require.NoError(t, b.stop())
}
