package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// env is one scenario's private schema: the outbox tables, migrated, and
// room for business tables (search_path points at it).
type env struct {
	s      *session
	id     string
	schema string
	tables outbox.Tables
	pool   *pgxpool.Pool
}

func randomID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newEnv creates and migrates a schema named after the scenario. close
// drops it with everything in it.
func (s *session) newEnv(ctx context.Context, name string, maxConns int32) (*env, error) {
	id := randomID()
	e := &env{s: s, id: id, schema: "bench_" + name + "_" + id}
	e.tables = outbox.Tables{Schema: e.schema}.WithDefaults()
	if _, err := s.admin.Exec(ctx, "CREATE SCHEMA "+pgident.Quote(e.schema)); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", e.schema, err)
	}
	pool, err := e.newPool(ctx, maxConns)
	if err != nil {
		e.close()
		return nil, err
	}
	e.pool = pool
	m, err := migrate.New(e.tables)
	if err != nil {
		e.close()
		return nil, err
	}
	if _, err := m.Up(ctx, pool); err != nil {
		e.close()
		return nil, fmt.Errorf("migrate %s: %w", e.schema, err)
	}
	return e, nil
}

// newPool connects with search_path set to the env's schema.
func (e *env) newPool(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.s.cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["search_path"] = e.schema
	return pgxpool.NewWithConfig(ctx, cfg)
}

func (e *env) close() {
	if e.pool != nil {
		e.pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.s.admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgident.Quote(e.schema)+" CASCADE"); err != nil {
		e.s.progress("drop schema %s: %v (drop it by hand)", e.schema, err)
	}
}

func (e *env) exec(ctx context.Context, sql string, args ...any) error {
	_, err := e.pool.Exec(ctx, sql, args...)
	return err
}

// The preloaded payload is an order of about 200 bytes, like the emit
// scenario's; aggregates are md5-derived UUIDs, spread round-robin.
const preloadSQL = `INSERT INTO %s (aggregate_id, type, payload, created_at, dispatched_at)
SELECT md5('aggregate-' || (g %% $2))::uuid, 'order.placed',
  jsonb_build_object('order_id', g, 'customer_id', 'customer-' || (g %% $2), 'total_cents', (g::bigint * 7919) %% 100000,
    'currency', 'EUR', 'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (g %% 97), 'qty', 1 + g %% 5, 'price_cents', 1999))),
  now(), CASE WHEN $3 THEN now() END
FROM generate_series(1, $1) g`

// Dispatched filler rows only have to be there: a small payload keeps the
// 10M-row preload short. Their width does not reach the claim, which reads
// the partial indexes of pending rows only.
const fillerSQL = `INSERT INTO %s (aggregate_id, type, payload, created_at, dispatched_at)
SELECT md5('aggregate-' || (g %% $2))::uuid, 'order.placed', '{"order_id":0}', now(), now()
FROM generate_series(1, $1) g`

// preload inserts n pending events over the given number of aggregates in
// one statement.
func (e *env) preload(ctx context.Context, n, aggregates int) error {
	if err := e.exec(ctx, fmt.Sprintf(preloadSQL, e.tables.OutboxIdent()), n, aggregates, false); err != nil {
		return fmt.Errorf("preload %d events: %w", n, err)
	}
	return nil
}

// reset empties the outbox, preloads n pending events and vacuums, so
// every drain starts from the same table.
func (e *env) reset(ctx context.Context, n, aggregates int) error {
	if err := e.exec(ctx, "TRUNCATE "+e.tables.OutboxIdent()+" RESTART IDENTITY"); err != nil {
		return err
	}
	if err := e.preload(ctx, n, aggregates); err != nil {
		return err
	}
	if err := e.vacuum(ctx); err != nil {
		return err
	}
	e.checkpoint(ctx)
	return nil
}

// checkpoint starts the measurement right after a checkpoint, so every run
// pays the same full-page writes rather than whichever run a checkpoint
// happens to land in. It needs superuser (or pg_checkpoint); without it
// the runs are just noisier.
func (e *env) checkpoint(ctx context.Context) {
	if err := e.exec(ctx, "CHECKPOINT"); err != nil && !e.s.warnedCheckpoint {
		e.s.warnedCheckpoint = true
		e.s.progress("CHECKPOINT before each run failed (%v); figures will be noisier", err)
	}
}

// vacuum runs VACUUM ANALYZE on the outbox: autovacuum may be off (it is
// on this project's test server) and the planner needs fresh statistics.
func (e *env) vacuum(ctx context.Context) error {
	if err := e.exec(ctx, "VACUUM ANALYZE "+e.tables.OutboxIdent()); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	return nil
}

func (e *env) count(ctx context.Context, where string) (int64, error) {
	var n int64
	err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+e.tables.OutboxIdent()+" WHERE "+where).Scan(&n)
	return n, err
}

func (e *env) pending(ctx context.Context) (int64, error) {
	return e.count(ctx, "dispatched_at IS NULL")
}

// broker is the Kafka cluster of one run: the configured one, or a fresh
// in-process dev broker.
type broker struct {
	cfg kafka.ClientConfig
	dev *devkafka.Broker
}

func (s *session) startBroker() (*broker, error) {
	if len(s.cfg.Kafka.Brokers) > 0 {
		return &broker{cfg: s.cfg.Kafka}, nil
	}
	dev, err := devkafka.Start(devkafka.Config{Partitions: 6})
	if err != nil {
		return nil, err
	}
	cfg := s.cfg.Kafka
	cfg.Brokers = []string{dev.Addr()}
	return &broker{cfg: cfg, dev: dev}, nil
}

func (b *broker) close() {
	if b.dev != nil {
		b.dev.Close()
	}
}

func (b *broker) addrs() string { return strings.Join(b.cfg.Brokers, ",") }

// published sums the end offsets of topic's partitions: how many records
// the broker holds.
func (b *broker) published(ctx context.Context, topic string) (int64, error) {
	opts, err := b.cfg.Options()
	if err != nil {
		return 0, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("list end offsets of %s: %w", topic, err)
	}
	if err := offs.Error(); err != nil {
		return 0, fmt.Errorf("list end offsets of %s: %w", topic, err)
	}
	var n int64
	offs.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n, nil
}

// relayGroup is n relayers on one table, each with its own pool and Kafka
// client, as replicas would run.
type relayGroup struct {
	start      time.Time
	dispatched atomic.Int64
	batches    atomic.Int64
	lastBatch  atomic.Int64 // unix nanos of the latest batch's commit

	mu      sync.Mutex
	collect bool
	lat     []time.Duration

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stopOnce sync.Once
	stopErr  error
	errMu    sync.Mutex
	errs     []error
	closers  []func()
}

// startRelayers runs n relayers publishing to b with topic prefix (or,
// with no broker, to a publisher that acknowledges at once); mod adjusts
// each relayer's config. collect keeps every batch's latencies.
func (e *env) startRelayers(ctx context.Context, b *broker, n int, prefix string, collect bool, mod func(*relay.Config)) (*relayGroup, error) {
	g := &relayGroup{collect: collect}
	rctx, cancel := context.WithCancel(ctx)
	g.cancel = cancel
	var relayers []*relay.Relayer
	for range n {
		pool, err := e.newPool(ctx, 2)
		if err != nil {
			g.stop()
			return nil, err
		}
		g.closers = append(g.closers, pool.Close)
		var pub relay.Sink = nullPublisher{}
		if b != nil {
			client, err := kafkapub.NewPublisherClient(b.cfg)
			if err != nil {
				g.stop()
				return nil, err
			}
			g.closers = append(g.closers, client.Close)
			pub = kafkapub.NewPublisher(client, kafkapub.PublisherConfig{})
		}
		cfg := relay.Config{
			Common: relay.Common{Pool: pool, Sink: pub, Tables: e.tables, TopicPrefix: prefix, Logger: e.s.cfg.Logger,
				Hooks: []relay.Hook{g}},
		}
		if mod != nil {
			mod(&cfg)
		}
		r, err := relay.New(cfg)
		if err != nil {
			g.stop()
			return nil, err
		}
		relayers = append(relayers, r)
	}
	g.start = time.Now()
	for _, r := range relayers {
		g.wg.Go(func() {
			if err := r.Run(rctx); err != nil {
				g.errMu.Lock()
				g.errs = append(g.errs, err)
				g.errMu.Unlock()
			}
		})
	}
	return g, nil
}

// OnBatch counts the group's batches; the group is its relayers' relay.BatchHook.
func (g *relayGroup) OnBatch(res relay.BatchResult) {
	g.dispatched.Add(int64(res.Dispatched))
	g.batches.Add(1)
	g.lastBatch.Store(time.Now().UnixNano())
	if g.collect && len(res.Latencies) > 0 {
		g.mu.Lock()
		g.lat = append(g.lat, res.Latencies...)
		g.mu.Unlock()
	}
}

func (g *relayGroup) err() error {
	g.errMu.Lock()
	defer g.errMu.Unlock()
	return errors.Join(g.errs...)
}

// waitFor waits until the relayers dispatched want events and returns the
// time from start to the commit of the batch that got there.
func (g *relayGroup) waitFor(ctx context.Context, want int64, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for g.dispatched.Load() < want {
		if err := g.err(); err != nil {
			return 0, fmt.Errorf("relayer stopped: %w", err)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("relayers dispatched %d of %d events within %s", g.dispatched.Load(), want, timeout)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
	return time.Unix(0, g.lastBatch.Load()).Sub(g.start), nil
}

func (g *relayGroup) latencies() []time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lat
}

// stop cancels the relayers, waits for them and closes their clients.
// Calling it again returns the first call's result.
func (g *relayGroup) stop() error {
	g.stopOnce.Do(func() {
		g.cancel()
		done := make(chan struct{})
		go func() { g.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(45 * time.Second):
			g.stopErr = errors.New("relayers did not stop within 45s")
			return
		}
		for i := len(g.closers) - 1; i >= 0; i-- {
			g.closers[i]()
		}
		g.stopErr = g.err()
	})
	return g.stopErr
}

// drainResult is one timed drain of a preloaded table.
type drainResult struct {
	events    int64
	elapsed   time.Duration
	batches   int64
	published int64
	// serverCPU is the walsender's CPU time (WAL readers, a server on
	// this machine); clientCPU the reader's: pg_recvlogical's, or this
	// process's (relayer and dev broker). 0 when not measured.
	serverCPU, clientCPU time.Duration
}

func (d drainResult) rate() float64 { return perSecond(d.events, d.elapsed) }

// drainWithRelayers drains the table's n pending events with the given
// number of relayers, then checks nothing is left pending and the broker
// holds every event.
func (e *env) drainWithRelayers(ctx context.Context, b *broker, relayers int, want int64, mod func(*relay.Config)) (drainResult, error) {
	prefix := fmt.Sprintf("bench%s_%s_", e.id, randomID())
	g, err := e.startRelayers(ctx, b, relayers, prefix, false, mod)
	if err != nil {
		return drainResult{}, err
	}
	elapsed, werr := g.waitFor(ctx, want, drainTimeout(want))
	serr := g.stop()
	if werr != nil {
		return drainResult{}, werr
	}
	if serr != nil {
		return drainResult{}, serr
	}
	res := drainResult{events: g.dispatched.Load(), elapsed: elapsed, batches: g.batches.Load()}
	if err := e.checkDrained(ctx, b, prefix+"order", want, &res); err != nil {
		return res, err
	}
	return res, nil
}

// checkDrained verifies a drain: nothing pending, exactly want events
// dispatched (no event counted twice), and the broker holds at least want
// records (more only if a batch was re-sent, which a clean run never does).
func (e *env) checkDrained(ctx context.Context, b *broker, topic string, want int64, res *drainResult) error {
	pending, err := e.pending(ctx)
	if err != nil {
		return err
	}
	if pending != 0 {
		return fmt.Errorf("%d events still pending after the drain", pending)
	}
	if res.events != want {
		return fmt.Errorf("relayers reported %d dispatched events; want %d", res.events, want)
	}
	if res.published, err = b.published(ctx, topic); err != nil {
		return err
	}
	if res.published < want {
		return fmt.Errorf("broker holds %d records on %s; want %d", res.published, topic, want)
	}
	return nil
}

// drainTimeout allows for a relay far slower than expected (1,000 events/s)
// before a drain is declared stuck.
func drainTimeout(events int64) time.Duration {
	return time.Minute + time.Duration(events)*time.Millisecond
}
