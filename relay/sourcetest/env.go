package sourcetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// env is one scenario's outbox, broker and producer.
type env struct {
	src      Source
	db       *DB
	broker   *devkafka.Broker
	producer *outbox.Producer
}

// pg is the outbox as the project's test helpers take it.
func (e *env) pg() *pgtest.DB { return (*pgtest.DB)(e.db) }

// open gives a scenario a fresh outbox of src and a broker of its own
// (6 partitions; brokerOpts for limits and faults).
func open(t *testing.T, src Source, brokerOpts ...kfake.Opt) *env {
	t.Helper()
	src.check(t)
	db := src.Open(t)
	b, err := devkafka.Start(devkafka.Config{Partitions: 6, Opts: brokerOpts})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	return &env{src: src, db: db, broker: b, producer: p}
}

// limitBroker is a broker whose message.max.bytes is 100,000, small enough
// that the poison scenarios' large events exceed it.
func limitBroker() kfake.Opt {
	return kfake.BrokerConfigs(map[string]string{"message.max.bytes": "100000"})
}

// client builds a publisher client on the scenario's broker; opts go after
// the test defaults.
func (e *env) client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{e.broker.Addr()},
		Opts: append([]kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}, opts...)})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	return client
}

// publisher builds a Kafka publisher for the source on a client of its own.
func (e *env) publisher(t *testing.T, cfg kafkapub.PublisherConfig, opts ...kgo.Opt) relay.Sink {
	t.Helper()
	return e.publisherOn(e.client(t, opts...), cfg)
}

// publisherOn builds a Kafka publisher for the source on client.
func (e *env) publisherOn(client *kgo.Client, cfg kafkapub.PublisherConfig) relay.Sink {
	cfg.Source = e.src.EventSource
	return kafkapub.NewPublisher(client, cfg)
}

// start starts n relayers, each with a publisher of its own.
func (e *env) start(t *testing.T, n int, cfg RelayerConfig) []*Relayer {
	t.Helper()
	rs := make([]*Relayer, n)
	for i := range rs {
		rs[i] = e.src.Start(t, e.db, e.publisher(t, kafkapub.PublisherConfig{}), cfg)
	}
	return rs
}

func stopAll(rs []*Relayer) {
	for _, r := range rs {
		r.Stop()
	}
}

// event is a committed event: its aggregate, and its place in the
// aggregate's commit order (seq: the id, for writers whose ids follow
// commit order; a version otherwise).
type event struct {
	agg uuid.UUID
	seq int64
}

func newAggregates(n int) []uuid.UUID {
	out := make([]uuid.UUID, n)
	for i := range out {
		out[i] = uuid.New()
	}
	return out
}

// emit commits one event with Emit, in its own transaction.
func (e *env) emit(t *testing.T, agg uuid.UUID, typ string, payload any) int64 {
	t.Helper()
	var id int64
	err := pgx.BeginFunc(context.Background(), e.db.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = e.producer.Emit(context.Background(), tx, outbox.Event{AggregateID: agg, Type: typ, Payload: payload})
		return err
	})
	require.NoError(t, err)
	return id
}

// preload inserts n rows in one statement, aggregate g % aggregates for
// the g-th row, and returns them.
func (e *env) preload(t *testing.T, n, aggregates int, typ string) map[int64]event {
	t.Helper()
	rows, err := e.db.Pool.Query(context.Background(), `INSERT INTO `+e.db.Tables.OutboxIdent()+` (aggregate_id, type, payload)
		SELECT md5($3 || (g % $2)::text)::uuid, $4, jsonb_build_object('n', g) FROM generate_series(1, $1) g ORDER BY g
		RETURNING id, aggregate_id`, n, aggregates, e.db.Tables.Schema, typ)
	require.NoError(t, err)
	out := make(map[int64]event, n)
	var (
		id  int64
		agg uuid.UUID
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &agg}, func() error {
		out[id] = event{agg: agg, seq: id}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, n, len(out), "rows preloaded")
	return out
}

// queuePlainInsert queues a plain INSERT of ev, as a producer that takes
// no per-aggregate lock writes it, returning its id.
func (e *env) queuePlainInsert(b *pgx.Batch, ev outbox.Event) {
	b.Queue(`INSERT INTO `+e.db.Tables.OutboxIdent()+` (aggregate_id, type, payload, headers) VALUES ($1, $2, $3, $4) RETURNING id`,
		ev.AggregateID, ev.Type, fmt.Sprintf(`{"plain": %q}`, ev.Type), `{"via": "insert"}`)
}

// plainInsert writes events with one plain INSERT each, taking no
// per-aggregate lock, and returns their ids in order.
func (e *env) plainInsert(ctx context.Context, tx pgx.Tx, events []outbox.Event) ([]int64, error) {
	batch := &pgx.Batch{}
	for _, ev := range events {
		e.queuePlainInsert(batch, ev)
	}
	br := tx.SendBatch(ctx, batch)
	ids := make([]int64, len(events))
	for i := range ids {
		if err := br.QueryRow().Scan(&ids[i]); err != nil {
			br.Close() //nolint:errcheck // reporting the insert's error
			return nil, err
		}
	}
	return ids, br.Close()
}

// emitSpread commits n events round-robin over aggregates, 50 per
// transaction, one transaction after the other, and returns them. For a
// source that keeps commit order, every other transaction is plain
// INSERTs without the per-aggregate lock.
func (e *env) emitSpread(t *testing.T, n, aggregates int, typ string) map[int64]event {
	t.Helper()
	ctx := context.Background()
	aggs := newAggregates(aggregates)
	committed := make(map[int64]event, n)
	for i, txn := 0, 0; i < n; i, txn = i+50, txn+1 {
		batch := make([]outbox.Event, 0, 50)
		for j := i; j < min(i+50, n); j++ {
			batch = append(batch, outbox.Event{AggregateID: aggs[j%aggregates], Type: typ, Payload: map[string]int{"n": j}})
		}
		require.NoError(t, pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
			var ids []int64
			var err error
			if e.src.CommitOrder && txn%2 == 1 {
				ids, err = e.plainInsert(ctx, tx, batch)
			} else {
				ids, err = e.producer.EmitBatch(ctx, tx, batch)
			}
			for k, id := range ids {
				committed[id] = event{agg: batch[k].AggregateID, seq: id}
			}
			return err
		}))
	}
	return committed
}

var errRollback = errors.New("rolled back on purpose")

// writeLoad commits events events on aggregates aggregates from writers
// goroutines, in transactions of 1 to 5 events; one transaction in ten is
// rolled back instead. It returns every committed event. It blocks until
// done; run it beside relayers to test them under concurrent writes.
//
// The events are written with EmitBatch, whose per-aggregate lock makes
// ids follow each aggregate's commit order. For a source that keeps
// commit order (CommitOrder), every other transaction is plain INSERTs
// without that lock, whose ids need not follow it; so there every
// transaction, after its events, also bumps the version of each of its
// aggregates, as an application's aggregate row would (a row lock held to
// commit, taken in one order by all): the versions are the aggregates'
// commit order, which the broker must follow.
func (e *env) writeLoad(t *testing.T, events, aggregates, writers int, typ string) map[int64]event {
	t.Helper()
	// Generous: a small machine under -race, running the other scenarios
	// at once, writes a large load slowly.
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	lw := e.openLoad(ctx, t, aggregates, writers)
	defer lw.pool.Close()

	var mu sync.Mutex
	committed := make(map[int64]event, events)
	var wg sync.WaitGroup
	for w := range writers {
		share := events / writers
		if w < events%writers {
			share++
		}
		wg.Go(func() {
			lw.writeShare(ctx, t, w, share, typ, func(got map[int64]event) {
				mu.Lock()
				maps.Copy(committed, got)
				mu.Unlock()
			})
		})
	}
	wg.Wait()
	return committed
}

// load is what writeLoad's writers share.
type load struct {
	e    *env
	pool *pgxpool.Pool // writers' connections, without synchronous commit
	aggs []uuid.UUID
	// bump adds $2 to the version of aggregate $1 and returns it; empty
	// unless the source keeps commit order.
	bump string
}

// openLoad creates the aggregates (and their version table, for a source
// that keeps commit order) and a pool for writers writers; the caller
// closes the pool.
func (e *env) openLoad(ctx context.Context, t *testing.T, aggregates, writers int) *load {
	t.Helper()
	lw := &load{e: e, aggs: newAggregates(aggregates)}
	if e.src.CommitOrder {
		versions := pgident.Qualified(e.db.Tables.Schema, "sourcetest_versions")
		_, err := e.db.Pool.Exec(ctx, `CREATE TABLE `+versions+` (aggregate_id uuid PRIMARY KEY, v bigint NOT NULL)`)
		require.NoError(t, err)
		_, err = e.db.Pool.Exec(ctx, `INSERT INTO `+versions+` SELECT unnest($1::uuid[]), 0`, lw.aggs)
		require.NoError(t, err)
		lw.bump = `UPDATE ` + versions + ` SET v = v + $2 WHERE aggregate_id = $1 RETURNING v`
	}
	// The writers' own durability is not under test, and on a shared
	// 2-core machine an fsync per commit made them the slowest part.
	cfg, err := pgxpool.ParseConfig(e.db.URL)
	require.NoError(t, err)
	cfg.MaxConns = int32(writers)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	lw.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	return lw
}

// writeShare is writer w's part of the load: transactions of 1 to 5
// random events until share of them committed, one transaction in ten
// rolled back, every other one plain INSERTs for a source that keeps
// commit order. It hands each committed transaction's events to commit.
func (lw *load) writeShare(ctx context.Context, t *testing.T, w, share int, typ string, commit func(map[int64]event)) {
	rnd := rand.New(rand.NewPCG(uint64(w), 42))
	for done, txn := 0, 0; done < share; txn++ {
		k := min(1+rnd.IntN(5), share-done)
		batch := make([]outbox.Event, k)
		for i := range batch {
			batch[i] = outbox.Event{AggregateID: lw.aggs[rnd.IntN(len(lw.aggs))], Type: typ,
				Payload: map[string]any{"writer": w, "txn": txn}, Headers: map[string]string{"writer": strconv.Itoa(w)}}
		}
		plain := lw.e.src.CommitOrder && txn%2 == 1
		rollback := txn%10 == 9
		var got map[int64]event
		err := pgx.BeginFunc(ctx, lw.pool, func(tx pgx.Tx) error {
			var err error
			if got, err = lw.write(ctx, tx, batch, plain); err != nil {
				return err
			}
			if rollback {
				return errRollback
			}
			return nil
		})
		if rollback && errors.Is(err, errRollback) {
			continue
		}
		if err != nil {
			t.Errorf("writer %d: %v", w, err)
			return
		}
		commit(got)
		done += k
	}
}

// write writes one transaction's events and returns them: with EmitBatch,
// or (plain) INSERTs pipelined with the version bumps.
func (lw *load) write(ctx context.Context, tx pgx.Tx, evs []outbox.Event, plain bool) (map[int64]event, error) {
	var ids []int64
	if !plain {
		var err error
		if ids, err = lw.e.producer.EmitBatch(ctx, tx, evs); err != nil {
			return nil, err
		}
	}
	if !lw.e.src.CommitOrder {
		got := make(map[int64]event, len(ids))
		for i, id := range ids {
			got[id] = event{agg: evs[i].AggregateID, seq: id}
		}
		return got, nil
	}
	plainIDs, after, err := lw.insertAndBump(ctx, tx, evs, plain)
	if err != nil {
		return nil, err
	}
	if plain {
		ids = plainIDs
	}
	return versionedEvents(evs, ids, after), nil
}

// insertAndBump sends, in one pipeline, the plain INSERTs of evs (if
// plain) and the version bumps of their aggregates, in one order for all
// writers. It returns the inserted ids (nil unless plain) and each
// aggregate's version after the transaction.
func (lw *load) insertAndBump(ctx context.Context, tx pgx.Tx, evs []outbox.Event, plain bool) (ids []int64, after map[uuid.UUID]int64, err error) {
	counts := map[uuid.UUID]int64{}
	for _, ev := range evs {
		counts[ev.AggregateID]++
	}
	order := slices.SortedFunc(maps.Keys(counts), func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) })
	b := &pgx.Batch{}
	if plain {
		for _, ev := range evs {
			lw.e.queuePlainInsert(b, ev)
		}
	}
	for _, agg := range order {
		b.Queue(lw.bump, agg, counts[agg])
	}
	br := tx.SendBatch(ctx, b)
	if plain {
		ids = make([]int64, len(evs))
		for i := range ids {
			if err := br.QueryRow().Scan(&ids[i]); err != nil {
				br.Close() //nolint:errcheck // reporting the insert's error
				return nil, nil, err
			}
		}
	}
	after = make(map[uuid.UUID]int64, len(order))
	for _, agg := range order {
		var v int64
		if err := br.QueryRow().Scan(&v); err != nil {
			br.Close() //nolint:errcheck // reporting the update's error
			return nil, nil, err
		}
		after[agg] = v
	}
	if err := br.Close(); err != nil {
		return nil, nil, err
	}
	return ids, after, nil
}

// versionedEvents places the events evs (written with ids) in their
// aggregates' commit order: a transaction's own events of an aggregate
// follow their insert order, the last one at the aggregate's version
// after the transaction.
func versionedEvents(evs []outbox.Event, ids []int64, after map[uuid.UUID]int64) map[int64]event {
	got := make(map[int64]event, len(ids))
	for i, id := range ids {
		agg := evs[i].AggregateID
		later := int64(0)
		for _, ev := range evs[i+1:] {
			if ev.AggregateID == agg {
				later++
			}
		}
		got[id] = event{agg: agg, seq: after[agg] - later}
	}
	return got
}

// record is what a test reads back from the broker.
type record = kafkatest.Record

// consume reads every record of topics from the beginning until want
// records arrived (and a short quiet period more, so duplicates are seen),
// or fails after timeout.
func (e *env) consume(t *testing.T, want int, timeout time.Duration, topics ...string) []record {
	t.Helper()
	return kafkatest.Collect(t, e.broker.Addr(), want, timeout, topics...)
}

// checkDelivered asserts that recs hold every committed event at least
// once and nothing that was not committed, each under its aggregate's key
// with the source's event_source header, in per-aggregate commit order
// (checkOrder). It returns the ids delivered more than once, with how many
// times more.
func (e *env) checkDelivered(t *testing.T, committed map[int64]event, recs []record) map[int64]int {
	t.Helper()
	seen := make(map[int64]bool, len(committed))
	dups := map[int64]int{}
	for _, r := range recs {
		ev, ok := committed[r.EventID]
		require.True(t, ok, "%s: event %d reached the broker but was never committed (or must not be published)", e.src.Name, r.EventID)
		require.Equal(t, ev.agg.String(), r.Key, "event %d has the wrong key", r.EventID)
		require.Equal(t, e.src.EventSource, r.Headers[outbox.HeaderEventSource], "event %d: event_source header", r.EventID)
		if seen[r.EventID] {
			dups[r.EventID]++
		}
		seen[r.EventID] = true
	}
	var missing []int64
	for id := range committed {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	slices.Sort(missing)
	require.Empty(t, missing, "%s: %d committed events never reached the broker", e.src.Name, len(missing))
	checkOrder(t, committed, recs)
	return dups
}

func total(dups map[int64]int) int {
	n := 0
	for _, k := range dups {
		n += k
	}
	return n
}

// checkOrder asserts that each key lives in exactly one partition and
// that, per key, the first delivery of each event comes in the
// aggregate's commit order (committed's seq). That is the order a
// deduplicating consumer applies events in: at-least-once re-sends (a
// suffix delivered again) pass, an event whose first delivery comes after
// a later event's does not.
func checkOrder(t *testing.T, committed map[int64]event, recs []record) {
	t.Helper()
	kafkatest.CheckOrder(t, recs, func(id int64) int64 { return committed[id].seq })
}

// waitUnacked waits until the source has exactly want (ascending) left to
// publish; only for sources that answer while relayers run (Holds).
func (e *env) waitUnacked(t *testing.T, want []int64, timeout time.Duration, msg string) {
	t.Helper()
	var got []int64
	ok := waitFor(timeout, func() bool {
		got = e.src.Unacked(t, e.db)
		return slices.Equal(got, want)
	})
	require.True(t, ok, "%s: %s: left to publish %v, want %v", e.src.Name, msg, got, want)
}

// waitFor polls cond every 20ms until it holds or timeout passes, and
// reports whether it held.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sortedKeys[V any](m map[int64]V) []int64 {
	out := make([]int64, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}
