package monitor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/ops/monitor"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

type bundle struct {
	db       *pgtest.DB
	broker   *devkafka.Broker
	producer *outbox.Producer
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	b, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	return &bundle{db: db, broker: b, producer: p}
}

// client is a publishing client on the bundle's broker.
func (b *bundle) client(t *testing.T) *kgo.Client {
	t.Helper()
	cl, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.broker.Addr()},
		Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

// relayConfig is a fast-polling relayer configuration on the bundle.
func (b *bundle) relayConfig(t *testing.T, cl *kgo.Client) relay.Config {
	return relay.Config{
		Pool:         b.db.Pool,
		Publisher:    kafkapub.NewPublisher(cl, kafkapub.PublisherConfig{}),
		Tables:       b.db.Tables,
		PollInterval: 50 * time.Millisecond,
		BackoffMin:   10 * time.Millisecond,
		BackoffMax:   200 * time.Millisecond,
		Logger:       testLogger(t),
	}
}

// testLogger writes to the test's output, shown with -v or on failure.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// start runs fn in the background until the test ends (or stop is called).
func start(t *testing.T, fn func(ctx context.Context)) (stop func()) {
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

func runRelayer(t *testing.T, r *relay.Relayer) (stop func()) {
	t.Helper()
	return start(t, func(ctx context.Context) { require.NoError(t, r.Run(ctx)) })
}

// emit commits one event in its own transaction.
func (b *bundle) emit(t *testing.T, agg uuid.UUID, typ string, payload any) int64 {
	t.Helper()
	var id int64
	err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = b.producer.Emit(context.Background(), tx, outbox.Event{AggregateID: agg, Type: typ, Payload: payload})
		return err
	})
	require.NoError(t, err)
	return id
}

func (b *bundle) exec(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	tag, err := b.db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
	return tag.RowsAffected()
}

func (b *bundle) count(t *testing.T, where string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.db.Tables.OutboxIdent()+" WHERE "+where, args...).Scan(&n))
	return n
}

// consumeIDs reads every record of topics until want distinct event ids
// arrived, or fails after timeout; it returns how often each id came.
func (b *bundle) consumeIDs(t *testing.T, want int, timeout time.Duration, topics ...string) map[int64]int {
	t.Helper()
	distinct := func(rs []*kgo.Record) map[int64]int {
		seen := map[int64]int{}
		for _, r := range rs {
			seen[kafkatest.EventID(r)]++
		}
		return seen
	}
	recs := kafkatest.Read(t, b.broker.Addr(), timeout, func(rs []*kgo.Record) bool { return len(distinct(rs)) >= want }, topics...)
	seen := distinct(recs)
	require.NotContains(t, seen, int64(0), "a record without a valid event_id header")
	return seen
}

// metrics is one scrape of /metrics.
type metrics map[string]*dto.MetricFamily

func scrape(t *testing.T, url string) metrics {
	t.Helper()
	m, err := tryScrape(url)
	require.NoError(t, err)
	return m
}

// tryScrape is scrape for Eventually conditions, which run off the test's
// goroutine and must not call t.FailNow.
func tryScrape(url string) (metrics, error) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// val is value without the ok, for conditions: absent reads as 0.
func (m metrics) val(name string, labels ...string) float64 {
	v, _ := m.value(name, labels...)
	return v
}

// value is the value of the sample of name whose labels include the given
// name/value pairs (summed over matching samples); a histogram gives its
// sample count. ok is false when the family or a matching sample is absent.
func (m metrics) value(name string, labels ...string) (v float64, ok bool) {
	mf := m[name]
	if mf == nil {
		return 0, false
	}
	for _, s := range mf.GetMetric() {
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range s.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			match = match && found
		}
		if !match {
			continue
		}
		ok = true
		switch {
		case s.Counter != nil:
			v += s.Counter.GetValue()
		case s.Gauge != nil:
			v += s.Gauge.GetValue()
		case s.Histogram != nil:
			v += float64(s.Histogram.GetSampleCount())
		}
	}
	return v, ok
}

func (m metrics) must(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, ok := m.value(name, labels...)
	require.True(t, ok, "metric %s%v missing from /metrics", name, labels)
	return v
}

// monitor builds a Monitor on the bundle with fast intervals; mod adjusts
// its config.
func (b *bundle) monitor(t *testing.T, mod func(*monitor.Config)) *monitor.Monitor {
	t.Helper()
	cfg := monitor.Config{
		Pool:             b.db.Pool,
		Tables:           b.db.Tables,
		RefreshInterval:  50 * time.Millisecond,
		WatchdogInterval: 200 * time.Millisecond,
		DisableCleanup:   true,
		Logger:           testLogger(t),
	}
	if mod != nil {
		mod(&cfg)
	}
	m, err := monitor.New(cfg)
	require.NoError(t, err)
	return m
}

// The WAL-mode tests share one throwaway wal_level=logical cluster,
// started by the first of them (the machine's server has replica).
var (
	logicalOnce sync.Once
	logical     *tmppg.Cluster
	logicalErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if logical != nil {
		_ = logical.Stop()
	}
	os.Exit(code)
}

// needLogical starts the shared wal_level=logical cluster once and returns
// its URL; without one, the test (what names it) fails in CI and is
// skipped elsewhere.
func needLogical(t *testing.T, what string) string {
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

// walSetup gives a schema on the logical cluster with the outbox's slot
// and publication created (walrelay.Setup), as a WAL relay leaves them.
func walSetup(t *testing.T) (*pgtest.DB, string) {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 6, ServerURL: needLogical(t, "the WAL monitor tests")})
	slot := walrelay.DefaultNameOf(db.Pool, db.Tables)
	require.NoError(t, walrelay.Setup(context.Background(), db.Pool, db.Tables, slot, slot))
	t.Cleanup(func() { _ = walrelay.Teardown(context.Background(), db.Pool, slot, slot) })
	return db, slot
}
