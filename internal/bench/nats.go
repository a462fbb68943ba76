package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/natspub"
	"github.com/pgoutbox/outbox/routing"
)

// envBenchNATS names the NATS server of the nats scenario.
const envBenchNATS = "OUTBOX_BENCH_NATS_URL"

// natsBench is the nats scenario's server and stream.
type natsBench struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
	prefix string
}

func openNATSBench(ctx context.Context, e *env) (*natsBench, error) {
	url := os.Getenv(envBenchNATS)
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, fmt.Errorf("nats scenario: cannot reach %s (set %s): %w", url, envBenchNATS, err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(natspub.DefaultMaxInFlight))
	if err != nil {
		nc.Close()
		return nil, err
	}
	id := "bench" + e.id + randomID()
	b := &natsBench{nc: nc, js: js, stream: id, prefix: id + "."}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: id, Subjects: []string{b.prefix + ">"}}); err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats scenario: create stream: %w", err)
	}
	return b, nil
}

func (b *natsBench) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = b.js.DeleteStream(ctx, b.stream)
	b.nc.Close()
}

// purge empties the stream between runs.
func (b *natsBench) purge(ctx context.Context) error {
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return err
	}
	return s.Purge(ctx)
}

func (b *natsBench) stored(ctx context.Context) (int64, error) {
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int64(info.State.Msgs), nil
}

func runNATS(ctx context.Context, s *session) (*Result, error) {
	n := int64(s.cfg.Events)
	e, err := s.newEnv(ctx, "nats", int32(latencyWriters(s.cfg.Writers, 1000)+2))
	if err != nil {
		return nil, err
	}
	defer e.close()
	b, err := openNATSBench(ctx, e)
	if err != nil {
		return nil, err
	}
	defer b.close()

	res := &Result{}
	res.param("server", "nats-server at %s (%s), one stream (file storage, defaults) capturing the scenario's subjects", b.nc.ConnectedUrlRedacted(), b.nc.ConnectedServerVersion())
	res.param("preload", "%s pending events over %s aggregates", thousands(n), thousands(int64(s.cfg.Aggregates)))
	res.param("relay", "relay.New with defaults + natspub.Publisher (async publish, every ack awaited, an aggregate's next message after its previous ack)")
	res.param("nats.go", "the same messages (subject, headers, payload) read from the table first, published by nats.go's jetstream PublishMsgAsync with every ack awaited, no ordering rule")

	s.progress("nats: relay draining %d events", n)
	relayed, err := natsDrain(ctx, s, e, b, n)
	if err != nil {
		return nil, fmt.Errorf("relay drain: %w", err)
	}
	s.progress("nats: nats.go publishing the same %d messages", n)
	direct, err := natsDirect(ctx, e, b, n)
	if err != nil {
		return nil, fmt.Errorf("nats.go publish: %w", err)
	}
	x := relayed.rate() / perSecond(n, direct)
	res.Tables = append(res.Tables, Table{Title: "drain throughput to JetStream", Columns: []string{"publisher", "events", "seconds", "ev/s"},
		Rows: [][]string{
			{"outbox relay (natspub)", thousands(n), fmt.Sprintf("%.2f", relayed.elapsed.Seconds()), rate(relayed.rate())},
			{"nats.go PublishMsgAsync", thousands(n), fmt.Sprintf("%.2f", direct.Seconds()), rate(perSecond(n, direct))},
		}})
	res.metric("nats.relay_per_s", relayed.rate())
	res.metric("nats.client_per_s", perSecond(n, direct))
	res.metric("nats.ratio", x)
	res.target("NATS drain vs nats.go", ">= 0.6x", ratio(x), x >= 0.6)

	s.progress("nats: latency at 1,000 events/s")
	if err := natsLatency(ctx, s, e, b, res); err != nil {
		return res, fmt.Errorf("latency: %w", err)
	}
	return res, nil
}

func (b *natsBench) publisher() (relay.Sink, error) {
	return natspub.New(b.nc, natspub.Config{})
}

// natsDrain drains a fresh preload with one relayer publishing to b.
func natsDrain(ctx context.Context, s *session, e *env, b *natsBench, n int64) (drainResult, error) {
	if err := e.reset(ctx, int(n), s.cfg.Aggregates); err != nil {
		return drainResult{}, err
	}
	if err := b.purge(ctx); err != nil {
		return drainResult{}, err
	}
	pub, err := b.publisher()
	if err != nil {
		return drainResult{}, err
	}
	g, err := e.startRelayers(ctx, nil, 1, b.prefix, false, func(c *relay.Config) { c.Sink = pub })
	if err != nil {
		return drainResult{}, err
	}
	elapsed, werr := g.waitFor(ctx, n, drainTimeout(n))
	if err := errors.Join(werr, g.stop()); err != nil {
		return drainResult{}, err
	}
	d := drainResult{events: g.dispatched.Load(), elapsed: elapsed, batches: g.batches.Load()}
	if d.published, err = b.stored(ctx); err != nil {
		return d, err
	}
	if d.published < n {
		return d, fmt.Errorf("the stream holds %d messages; want %d", d.published, n)
	}
	return d, nil
}

// natsDirect publishes the table's n events as the relay does, with
// nats.go alone, and returns how long it took until the last ack.
func natsDirect(ctx context.Context, e *env, b *natsBench, n int64) (time.Duration, error) {
	if err := b.purge(ctx); err != nil {
		return 0, err
	}
	rows, err := e.pool.Query(ctx, "SELECT id, aggregate_id::text, type, payload::text FROM "+e.tables.OutboxIdent()+" ORDER BY id")
	if err != nil {
		return 0, err
	}
	var msgs []*nats.Msg
	for rows.Next() {
		var id int64
		var agg, typ, payload string
		if err := rows.Scan(&id, &agg, &typ, &payload); err != nil {
			return 0, err
		}
		msgs = append(msgs, &nats.Msg{Subject: b.prefix + typ, Data: []byte(payload), Header: nats.Header{
			routing.HeaderNATSMsgID: {"direct:" + strconv.FormatInt(id, 10)}, outbox.HeaderEventID: {strconv.FormatInt(id, 10)},
			outbox.HeaderEventType: {typ}, outbox.HeaderContentType: {outbox.ContentTypeJSON}, outbox.HeaderAggregateID: {agg}}})
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	start := time.Now()
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, m := range msgs {
		f, err := b.js.PublishMsgAsync(m)
		if err != nil {
			return 0, err
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return 0, err
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	elapsed := time.Since(start)
	if got, err := b.stored(ctx); err != nil || got < n {
		return 0, fmt.Errorf("the stream holds %d messages; want %d (%v)", got, n, err)
	}
	return elapsed, nil
}

// natsLatency emits one event per transaction at 1,000/s for a window and
// reports commit-to-ack percentiles.
func natsLatency(ctx context.Context, s *session, e *env, b *natsBench, res *Result) error {
	window := pick(s.cfg.Short, 500*time.Millisecond, 10*time.Second)
	if err := e.exec(ctx, "TRUNCATE "+e.tables.OutboxIdent()); err != nil {
		return err
	}
	p, err := outbox.NewProducer(outbox.Config{Tables: e.tables, Routing: routing.NATS{TopicPrefix: b.prefix}})
	if err != nil {
		return err
	}
	pub, err := b.publisher()
	if err != nil {
		return err
	}
	clock := &ackClock{Sink: pub, acked: map[int64]time.Time{}, commited: map[int64]time.Time{}}
	g, err := e.startRelayers(ctx, nil, 1, b.prefix, true, func(c *relay.Config) { c.Sink = clock })
	if err != nil {
		return err
	}
	defer g.stop()                     //nolint:errcheck // stopped below; a second stop is a no-op
	time.Sleep(300 * time.Millisecond) // the relayer's first poll, then LISTEN
	r := latencyRun{rate: 1000}
	em, err := emitAtRate(ctx, s, e, p, clock, r, window, latencyWriters(s.cfg.Writers, r.rate))
	if err != nil {
		return err
	}
	if _, err := g.waitFor(ctx, em.events, 30*time.Second); err != nil {
		return err
	}
	if err := g.stop(); err != nil {
		return err
	}
	lat, err := clock.latencies()
	if err != nil {
		return err
	}
	p50, p99 := percentile(lat, 50), percentile(lat, 99)
	res.Tables = append(res.Tables, Table{Title: "commit-to-JetStream-ack latency, 1,000 events/s", Columns: []string{"achieved ev/s", "events", "p50 ms", "p99 ms", "max ms"},
		Rows: [][]string{{rate(perSecond(em.events, em.elapsed)), thousands(em.events), ms(p50), ms(p99), ms(percentile(lat, 100))}}})
	res.metric("nats.latency.p50_ms", float64(p50)/float64(time.Millisecond))
	res.metric("nats.latency.p99_ms", float64(p99)/float64(time.Millisecond))
	res.target("NATS latency p50 @1,000/s", "<= 5 ms", ms(p50)+" ms", p50 <= 5*time.Millisecond)
	res.target("NATS latency p99 @1,000/s", "<= 20 ms", ms(p99)+" ms", p99 <= 20*time.Millisecond)
	return nil
}
