package walrelay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/pgoutbox/outbox/internal/fakesink"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
	"github.com/pgoutbox/outbox/relay/sourcetest"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// Tests of the WAL source at its limits: a lost slot, batch and queue bytes,
// unknown and invalid topics, shutdown with a batch in flight, a change of
// leader, an event that cannot be parked, and the config's bounds (docs/wal.md,
// "Known limits", lists what the source does not handle).

func (b *bundle) insert(t *testing.T, typ, payload string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `INSERT INTO `+b.db.Tables.OutboxIdent()+` (aggregate_id, type, payload) VALUES ($1, $2, $3) RETURNING id`,
		uuid.New(), typ, payload).Scan(&id))
	return id
}

// emitMessage writes an event as a transactional logical message, with
// the fields given (id drawn from the outbox's sequence), and returns its
// id.
func (b *bundle) emitMessage(t *testing.T, fields map[string]any) int64 {
	t.Helper()
	ctx := context.Background()
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT nextval(pg_get_serial_sequence($1, 'id'))`, b.db.Tables.OutboxIdent()).Scan(&id))
	fields["id"] = id
	content, err := json.Marshal(fields)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, $2::text)`, walrelay.MessagePrefix(b.db.Tables), string(content))
	require.NoError(t, err)
	return id
}

// recorder wraps a publisher, records what it was given, and can hold the
// first call until released.
type recorder struct {
	fakesink.Kafka

	inner relay.Sink

	mu       sync.Mutex
	ids      map[int64]int
	maxBytes int // the largest sum of payloads in one call of several messages
	sizes    []int

	gate     bool
	held     []int64 // the ids of the call held at the gate
	entered  chan struct{}
	release  chan struct{}
	gateOnce sync.Once
}

func newRecorder(inner relay.Sink) *recorder {
	return &recorder{inner: inner, ids: map[int64]int{}, entered: make(chan struct{}), release: make(chan struct{})}
}

func (p *recorder) Publish(ctx context.Context, msgs []relay.Message) []error {
	size := 0
	for _, m := range msgs {
		size += len(m.Payload)
	}
	p.mu.Lock()
	for _, m := range msgs {
		p.ids[m.ID]++
	}
	p.sizes = append(p.sizes, size)
	if len(msgs) > 1 {
		p.maxBytes = max(p.maxBytes, size)
	}
	p.mu.Unlock()
	if p.gate {
		p.gateOnce.Do(func() {
			for _, m := range msgs {
				p.held = append(p.held, m.ID)
			}
			close(p.entered)
			<-p.release
		})
	}
	return p.inner.Publish(ctx, msgs)
}

func (p *recorder) sent(id int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ids[id]
}

func (b *bundle) kafkaPublisher(t *testing.T) relay.Sink {
	t.Helper()
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.broker.Addr()},
		Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	return kafkapub.NewPublisher(client, kafkapub.PublisherConfig{Source: "wal"})
}

func slotExists(t *testing.T, b *bundle) bool {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&n))
	return n > 0
}

// A slot that disappeared (a failover to a server without it, a manual
// drop) is not created again at the current position, which would skip
// what was committed since: Run fails with ErrSlotLost and says what to
// do.
func TestDisappearedSlotIsAClearErrorNotRecreated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relayer(t, nil)
	stop := run(t, r)
	waitLeading(t, r)
	first := b.insert(t, "order.placed", `{}`)
	recs := kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeast(1), "order")
	require.Equal(t, first, kafkatest.EventID(recs[0]))
	stop()

	b.insert(t, "order.placed", `{}`) // committed after the slot's position
	ctx := context.Background()
	require.Eventually(t, func() bool {
		_, err := b.db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, b.slot)
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "the slot stays active after the relayer stopped")

	r2 := b.relayer(t, nil)
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err := r2.Run(rctx)
	require.ErrorIs(t, err, walrelay.ErrSlotLost)
	require.NotContains(t, err.Error(), "\n")
	require.Contains(t, err.Error(), "--mode poll")
	require.Contains(t, err.Error(), "--teardown")
	require.False(t, slotExists(t, b), "the slot was created again")

	// After a teardown, a new slot is refused while the rows the WAL
	// source left pending (the second was never published) are there;
	// once the gap is republished by polling, which marks the rows, the
	// outbox starts over.
	require.NoError(t, walrelay.Teardown(ctx, b.db.Pool, b.slot, b.slot))
	require.ErrorIs(t, walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot), walrelay.ErrPendingBeforeSlot)
	_, err = b.db.Pool.Exec(ctx, `UPDATE `+b.db.Tables.OutboxIdent()+` SET dispatched_at = now()`)
	require.NoError(t, err)
	require.NoError(t, walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot))
	require.True(t, slotExists(t, b))
}

// Large payloads: batches and what is read ahead stay within
// MaxBatchBytes (plus one event), a larger event goes alone, and all
// arrive.
func TestMaxBatchBytesBoundsBatchesAndQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const limit = 64 << 10
	rec := newRecorder(b.kafkaPublisher(t))
	r := b.relayer(t, func(c *walrelay.Config) {
		c.Sink = rec
		c.MaxBatchBytes = limit
	})
	ctx := context.Background()
	require.NoError(t, walrelay.Setup(ctx, b.db.Pool, b.db.Tables, b.slot, b.slot))
	// Written before the relayer runs, so that the stream has them all to
	// read ahead at once.
	big := `{"pad": "` + strings.Repeat("y", 100<<10) + `"}`
	var ids []int64
	for i := range 60 {
		if i == 30 {
			ids = append(ids, b.insert(t, "order.placed", big))
			continue
		}
		ids = append(ids, b.insert(t, "order.placed", `{"pad": "`+strings.Repeat("x", 10<<10)+`"}`))
	}
	run(t, r)
	kafkatest.Read(t, b.broker.Addr(), 30*time.Second, kafkatest.AtLeast(len(ids)), "order")
	for _, id := range ids {
		require.Positive(t, rec.sent(id), "event %d", id)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.LessOrEqual(t, rec.maxBytes, limit, "a batch of several events over MaxBatchBytes")
	require.Greater(t, len(rec.sizes), 10, "batches were not cut by bytes")
	st := r.Stats()
	require.Positive(t, st.QueuedBytesMax)
	require.LessOrEqual(t, st.QueuedBytesMax, int64(limit+len(big)+100), "the queue grew past MaxBatchBytes and one event")
}

// A topic the broker does not know is retried for UnknownTopicGrace
// (created meanwhile, the event goes out); a type that makes no valid
// topic name is parked at once; past the grace, an unknown topic's event
// is parked.
func TestUnknownTopicIsRetriedWithinGraceInvalidNameParkedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A broker without topic auto-creation.
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(1))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: c.ListenAddrs(),
		Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	pub := kafkapub.NewPublisher(client, kafkapub.PublisherConfig{Source: "wal"})

	r := b.relayer(t, func(c *walrelay.Config) { c.Sink = pub; c.UnknownTopicGrace = time.Hour })
	run(t, r)
	waitLeading(t, r)
	waiting := b.insert(t, "invoice.sent", `{}`)
	badName := b.emitMessage(t, map[string]any{"aggregate_id": uuid.New(), "type": "bad topic.x", "payload": map[string]int{}})
	ctx := context.Background()
	parked := func(id int64) string {
		var reason string
		err := b.db.Pool.QueryRow(ctx, `SELECT reason FROM `+migrate.ParkedIdent(b.db.Tables)+` WHERE id = $1`, id).Scan(&reason)
		if err != nil {
			return ""
		}
		return reason
	}
	require.Eventually(t, func() bool { return r.Stats().FailedBatches >= 2 }, 30*time.Second, 20*time.Millisecond, "the unknown topic was not retried")
	require.Empty(t, parked(waiting), "an unknown topic parked within the grace")
	adm := kadm.NewClient(client)
	_, err = adm.CreateTopic(ctx, 1, 1, nil, "invoice")
	require.NoError(t, err)
	recs := kafkatest.Read(t, c.ListenAddrs()[0], 30*time.Second, kafkatest.AtLeast(1), "invoice")
	require.Equal(t, waiting, kafkatest.EventID(recs[0]))
	// The bad name, behind it in the stream, is parked as soon as it is
	// reached: not after the (hour-long) grace.
	require.Eventually(t, func() bool { return parked(badName) != "" }, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, "wal relay: invalid_topic", parked(badName))
	require.Empty(t, parked(waiting))
	// The counter moves just after the parking transaction commits.
	require.Eventually(t, func() bool { return r.Stats().Parked == 1 }, 5*time.Second, 10*time.Millisecond, "parked: %d", r.Stats().Parked)
}

// Past UnknownTopicGrace, an event of an unknown topic is parked and the
// stream goes on.
func TestUnknownTopicPastGraceIsParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(1))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: c.ListenAddrs(),
		Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	ctx := context.Background()
	_, err = kadm.NewClient(client).CreateTopic(ctx, 1, 1, nil, "order")
	require.NoError(t, err)
	r := b.relayer(t, func(cfg *walrelay.Config) {
		cfg.Sink = kafkapub.NewPublisher(client, kafkapub.PublisherConfig{Source: "wal"})
		cfg.UnknownTopicGrace = time.Millisecond
	})
	run(t, r)
	waitLeading(t, r)
	ghost := b.insert(t, "ghost.seen", `{}`)
	after := b.insert(t, "order.placed", `{}`)
	recs := kafkatest.Read(t, c.ListenAddrs()[0], 30*time.Second, kafkatest.AtLeast(1), "order")
	require.Equal(t, after, kafkatest.EventID(recs[0]))
	// The event behind it can reach the broker before the parking commits
	// (they share a batch): wait for the parked row.
	var reason string
	require.Eventually(t, func() bool {
		err := b.db.Pool.QueryRow(ctx, `SELECT reason FROM `+migrate.ParkedIdent(b.db.Tables)+` WHERE id = $1`, ghost).Scan(&reason)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		return true
	}, 10*time.Second, 20*time.Millisecond, "event %d was not parked", ghost)
	require.Equal(t, "wal relay: invalid_topic", reason)
}

// Stopping Run while a batch is out lets it finish and acknowledges it:
// the next leader re-sends none of it.
func TestStopLetsTheBatchInFlightFinish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := newRecorder(b.kafkaPublisher(t))
	rec.gate = true
	r := b.relayer(t, func(c *walrelay.Config) { c.Sink = rec })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitLeading(t, r)
	for range 3 {
		b.insert(t, "order.placed", `{}`)
	}
	select {
	case <-rec.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the batch never reached the publisher")
	}
	held := rec.held
	cancel() // the stop comes while the publisher holds the batch
	close(rec.release)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return")
	}
	st := r.Stats()
	require.EqualValues(t, len(held), st.Dispatched, "the batch in flight was cut short")
	require.Eventually(t, func() bool {
		var confirmed string
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&confirmed))
		lsn, err := pglogrepl.ParseLSN(confirmed)
		require.NoError(t, err)
		return lsn >= pglogrepl.LSN(st.AckedLSN)
	}, 10*time.Second, 20*time.Millisecond, "the slot was not told")

	rec2 := newRecorder(b.kafkaPublisher(t))
	r2 := b.relayer(t, func(c *walrelay.Config) { c.Sink = rec2 })
	run(t, r2)
	next := b.insert(t, "order.placed", `{}`)
	require.Eventually(t, func() bool { return rec2.sent(next) > 0 }, 20*time.Second, 20*time.Millisecond)
	for _, id := range held {
		require.Zero(t, rec2.sent(id), "event %d re-sent after a graceful stop", id)
	}
}

// countingHandler counts log records whose message contains match.
type countingHandler struct {
	slog.Handler
	match string
	n     *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, h.match) {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, rec)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(as), h.match, h.n}
}

// A new leader that finds the slot still read by a previous leader's
// stream (its walsender not ended yet: that leader paused, or cut off
// before the server noticed) for SlotBusyTimeout ends that stream, since
// it holds the lock that stream's leader lost, and leads; ending it is
// not a failed batch. A reader that is not a relayer's stream is not
// touched (TestSlotReadByAnotherProcessIsAClearError).
func TestNewLeaderEndsAPreviousLeadersStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old := b.holdSlot(t, "outbox-wal stream old")

	var ended atomic.Int64
	logger := slog.New(countingHandler{slog.Default().Handler(), "ending a previous leader's stream", &ended})
	r := b.relayer(t, func(c *walrelay.Config) { c.SlotBusyTimeout = 100 * time.Millisecond; c.Logger = logger })
	run(t, r) // its stop fails the test if Run returned an error
	waitLeading(t, r)
	require.EqualValues(t, 1, ended.Load(), "the new leader ends the old stream once")
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var err error
	for err == nil { // what the server sent before it ended the stream, then the end
		_, err = old.ReceiveMessage(rctx)
	}
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the old stream was not ended")
	id := b.insert(t, "order.placed", `{}`)
	recs := kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeast(1), "order")
	require.Equal(t, id, kafkatest.EventID(recs[0]))
	require.Zero(t, r.Stats().FailedBatches, "ending the old stream counted as a failed batch")
}

// An event that can be neither published nor parked (the parked table
// refuses it with a data error) is dropped and logged; the stream goes on.
func TestUnparkableEventIsDroppedAndStreamGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relayer(t, nil)
	run(t, r)
	waitLeading(t, r)
	// No aggregate_id: it is parked; its payload's \u0000 is valid JSON
	// that jsonb refuses (SQLSTATE 22P05).
	ctx := context.Background()
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT nextval(pg_get_serial_sequence($1, 'id'))`, b.db.Tables.OutboxIdent()).Scan(&id))
	_, err := b.db.Pool.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, $2::text)`, walrelay.MessagePrefix(b.db.Tables),
		fmt.Sprintf(`{"id": %d, "type": "order.placed", "payload": {"a": "\u0000"}}`, id))
	require.NoError(t, err)
	after := b.insert(t, "order.placed", `{}`)
	recs := kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeast(1), "order")
	require.Equal(t, after, kafkatest.EventID(recs[0]))
	// Parking (here: dropping) follows the publish of its batch.
	require.Eventually(t, func() bool { return r.Stats().Dropped == 1 }, 5*time.Second, 10*time.Millisecond, "dropped: %d", r.Stats().Dropped)
	require.Zero(t, r.Stats().Parked)
}

// Intervals out of range are refused; a tiny LeaderPollInterval works.
func TestConfigLimits(t *testing.T) {
	t.Parallel()
	_, err := walrelay.New(walrelay.Config{Common: relay.Common{Pool: nil}})
	require.Error(t, err)
	b := setup(t)
	_, err = walrelay.New(walrelay.Config{Common: relay.Common{Pool: b.db.Pool, Sink: nopPublisher{}, Tables: b.db.Tables}, StatusInterval: time.Minute})
	require.ErrorContains(t, err, "StatusInterval")
	r, err := walrelay.New(walrelay.Config{Common: relay.Common{Pool: b.db.Pool, Sink: nopPublisher{}, Tables: b.db.Tables}})
	require.NoError(t, err)
	require.Equal(t, relay.DefaultMaxBatchBytes, r.Config().MaxBatchBytes)
	require.Equal(t, relay.DefaultShutdownTimeout, r.Config().ShutdownTimeout)
	require.Equal(t, walrelay.DefaultUnknownTopicGrace, r.Config().UnknownTopicGrace)

	tiny := b.relayer(t, func(c *walrelay.Config) { c.LeaderPollInterval = time.Nanosecond })
	run(t, tiny)
	waitLeading(t, tiny)
	id := b.insert(t, "order.placed", `{}`)
	recs := kafkatest.Read(t, b.broker.Addr(), 20*time.Second, kafkatest.AtLeast(1), "order")
	require.Equal(t, id, kafkatest.EventID(recs[0]))
}

// The WAL source refuses the shared fields' bad values with the words of
// relay.Common.Validate, as the polling relay does.
func TestConfigRefusesBadCommons(t *testing.T) {
	t.Parallel()
	// pgxpool connects lazily: New never talks to the server.
	pool, err := pgxpool.New(context.Background(), pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	sourcetest.RefusesBadCommons(t, pool, nopPublisher{}, func(c relay.Common) error {
		_, err := walrelay.New(walrelay.Config{Common: c})
		return err
	})
}
