package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/amqppub"
)

// amqpURL is the RabbitMQ server of the amqp scenario:
// OUTBOX_BENCH_AMQP_URL, or guest on the local server.
func amqpURL() string {
	if u := os.Getenv("OUTBOX_BENCH_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// amqpTarget is one exchange of the scenario's own with a durable queue
// bound for every key, so every message is routed and stored.
type amqpTarget struct {
	conn *amqp.Connection
	ch   *amqp.Channel
	name string // the exchange's and the queue's
}

func newAMQPTarget() (*amqpTarget, error) {
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		return nil, fmt.Errorf("amqp: no RabbitMQ at %s (set OUTBOX_BENCH_AMQP_URL): %w", redactAMQP(amqpURL()), err)
	}
	t := &amqpTarget{conn: conn, name: "bench-" + randomID()}
	if t.ch, err = conn.Channel(); err == nil {
		err = t.ch.ExchangeDeclare(t.name, amqp.ExchangeTopic, true, false, false, false, nil)
	}
	if err == nil {
		_, err = t.ch.QueueDeclare(t.name, true, false, false, false, nil)
	}
	if err == nil {
		err = t.ch.QueueBind(t.name, "#", t.name, false, nil)
	}
	if err != nil {
		t.close()
		return nil, fmt.Errorf("amqp: set up exchange and queue: %w", err)
	}
	return t, nil
}

func redactAMQP(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}

// stored is how many messages the queue holds; purge empties it.
func (t *amqpTarget) stored() (int64, error) {
	q, err := t.ch.QueueDeclarePassive(t.name, true, false, false, false, nil)
	return int64(q.Messages), err
}

func (t *amqpTarget) purge() error {
	_, err := t.ch.QueuePurge(t.name, false)
	return err
}

func (t *amqpTarget) close() {
	if t.ch != nil {
		_, _ = t.ch.QueueDelete(t.name, false, false, false)
		_ = t.ch.ExchangeDelete(t.name, false, false)
	}
	_ = t.conn.Close()
}

func runAMQP(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	n := int64(cfg.Events)
	rounds := pick(cfg.Short, 1, 3)
	target, err := newAMQPTarget()
	if err != nil {
		return nil, err
	}
	defer target.close()
	e, err := s.newEnv(ctx, "amqp", 4)
	if err != nil {
		return nil, err
	}
	defer e.close()

	res := &Result{}
	res.param("server", "RabbitMQ at %s; a durable topic exchange and one durable classic queue bound with '#', purged between runs", redactAMQP(amqpURL()))
	res.param("preload", "%s pending events over %s aggregates, fresh for every drain", thousands(n), thousands(int64(cfg.Aggregates)))
	res.param("relay", "one relay.New with defaults + amqppub.Publisher (publisher confirms, persistent, mandatory; one message in flight per aggregate)")
	res.param("client", "amqp091-go alone, publishing the same messages (same headers, persistent, mandatory, confirms) with every message in flight, then waiting for every confirm; no database")
	var relayRates, clientRates []float64
	for round := range rounds {
		s.progress("amqp: round %d/%d: relay drain", round+1, rounds)
		d, err := amqpDrain(ctx, s, e, target, n)
		if err != nil {
			return nil, fmt.Errorf("relay drain: %w", err)
		}
		relayRates = append(relayRates, d)
		s.progress("amqp: round %d/%d: amqp091-go alone", round+1, rounds)
		c, err := amqpClientPublish(ctx, target, n, cfg.Aggregates)
		if err != nil {
			return nil, fmt.Errorf("amqp091-go: %w", err)
		}
		clientRates = append(clientRates, c)
	}
	slices.Sort(relayRates)
	slices.Sort(clientRates)
	relayRate, clientRate := relayRates[len(relayRates)/2], clientRates[len(clientRates)/2]
	res.Tables = append(res.Tables, Table{Title: fmt.Sprintf("publish %s events to RabbitMQ (median of %d rounds)", thousands(n), rounds),
		Columns: []string{"publisher", "events/s", "vs amqp091-go"},
		Rows: [][]string{{"outbox relay, 1 relayer", rate(relayRate), ratio(relayRate / clientRate)},
			{"amqp091-go alone", rate(clientRate), "1.00x"}}})
	res.metric("amqp.relay.events_per_s", relayRate)
	res.metric("amqp.client.events_per_s", clientRate)
	res.target("amqp drain vs amqp091-go", ">= 0.6x", ratio(relayRate/clientRate), relayRate/clientRate >= 0.6)
	if err := amqpLatency(ctx, s, e, target, res); err != nil {
		return res, fmt.Errorf("latency: %w", err)
	}
	return res, nil
}

// amqpDrain drains a fresh preload of n events with one relayer and
// returns its rate, after checking every event reached the queue.
func amqpDrain(ctx context.Context, s *session, e *env, target *amqpTarget, n int64) (float64, error) {
	if err := target.purge(); err != nil {
		return 0, err
	}
	if err := e.reset(ctx, int(n), s.cfg.Aggregates); err != nil {
		return 0, err
	}
	g, err := startAMQPRelayers(ctx, e, target.name, false, nil)
	if err != nil {
		return 0, err
	}
	elapsed, werr := g.waitFor(ctx, n, drainTimeout(n))
	if err := errors.Join(werr, g.stop()); err != nil {
		return 0, err
	}
	if got, err := target.stored(); err != nil || got < n {
		return 0, fmt.Errorf("the queue holds %d messages, want %d (%v)", got, n, err)
	}
	return perSecond(n, elapsed), nil
}

// startAMQPRelayers runs one relayer publishing to exchange; wrap, when
// set, wraps its sink.
func startAMQPRelayers(ctx context.Context, e *env, exchange string, collect bool, wrap func(relay.Sink) relay.Sink) (*relayGroup, error) {
	g := &relayGroup{collect: collect}
	rctx, cancel := context.WithCancel(ctx)
	g.cancel = cancel
	pool, err := e.newPool(ctx, 2)
	if err != nil {
		cancel()
		return nil, err
	}
	g.closers = append(g.closers, pool.Close)
	pub, err := amqppub.New(amqppub.Config{URL: amqpURL(), Exchange: exchange, Logger: e.s.cfg.Logger})
	if err != nil {
		_ = g.stop()
		return nil, err
	}
	g.closers = append(g.closers, func() { _ = pub.Close() })
	var sink relay.Sink = pub
	if wrap != nil {
		sink = wrap(pub)
	}
	r, err := relay.New(relay.Config{Common: relay.Common{Pool: pool, Sink: sink, Tables: e.tables, Logger: e.s.cfg.Logger, Hooks: []relay.Hook{g}}})
	if err != nil {
		_ = g.stop()
		return nil, err
	}
	g.start = time.Now()
	g.wg.Go(func() {
		if err := r.Run(rctx); err != nil {
			g.errMu.Lock()
			g.errs = append(g.errs, err)
			g.errMu.Unlock()
		}
	})
	return g, nil
}

// amqpClientPublish publishes n messages like the relay's with amqp091-go
// alone, all in flight at once, and returns the rate at which the server
// confirmed them.
func amqpClientPublish(ctx context.Context, target *amqpTarget, n int64, aggregates int) (float64, error) {
	if err := target.purge(); err != nil {
		return 0, err
	}
	ch, err := target.conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 4096))
	aggs := make([]string, aggregates)
	for i := range aggs {
		aggs[i] = uuid.NewString()
	}
	body := []byte(`{"items": [{"sku": "SKU-1", "qty": 1, "price_cents": 1999}], "currency": "EUR", "order_id": 1, "customer_id": "customer-1", "total_cents": 7919}`)
	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		for i := range n {
			id := strconv.FormatInt(i+1, 10)
			err := ch.PublishWithContext(ctx, target.name, "order.placed", true, false, amqp.Publishing{
				Headers:     amqp.Table{outbox.HeaderEventID: id, outbox.HeaderEventType: "order.placed", outbox.HeaderAggregateID: aggs[int(i)%len(aggs)]},
				ContentType: outbox.ContentTypeJSON, DeliveryMode: amqp.Persistent, MessageId: id, Type: "order.placed", Body: body,
			})
			if err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for range n {
		c, ok := <-confirms
		if !ok || !c.Ack {
			return 0, fmt.Errorf("message %d not confirmed", c.DeliveryTag)
		}
	}
	elapsed := time.Since(start)
	if err := <-errc; err != nil {
		return 0, err
	}
	return perSecond(n, elapsed), nil
}

// amqpLatency measures commit-to-confirm at 1,000 events/s: one event
// per transaction, one relayer with default settings (LISTEN/NOTIFY).
func amqpLatency(ctx context.Context, s *session, e *env, target *amqpTarget, res *Result) error {
	window := pick(s.cfg.Short, 500*time.Millisecond, 10*time.Second)
	if err := e.exec(ctx, "TRUNCATE "+e.tables.OutboxIdent()); err != nil {
		return err
	}
	if err := target.purge(); err != nil {
		return err
	}
	p, err := outbox.NewProducer(outbox.Config{Tables: e.tables})
	if err != nil {
		return err
	}
	clock := &ackClock{acked: map[int64]time.Time{}, commited: map[int64]time.Time{}}
	g, err := startAMQPRelayers(ctx, e, target.name, true, func(sink relay.Sink) relay.Sink { clock.Sink = sink; return clock })
	if err != nil {
		return err
	}
	defer g.stop() //nolint:errcheck // stopped below; a second stop is a no-op
	time.Sleep(300 * time.Millisecond)
	s.progress("amqp: latency at 1,000 events/s for %s", window)
	r := latencyRun{rate: 1000}
	writers := latencyWriters(s.cfg.Writers, r.rate)
	em, err := emitAtRate(ctx, s, e, p, clock, r, window, writers)
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
	p50, p99, mx := percentile(lat, 50), percentile(lat, 99), percentile(lat, 100)
	s.progress("amqp: amqp091-go alone at 1,000 messages/s for %s", window)
	alone, err := amqpClientLatency(ctx, target, window)
	if err != nil {
		return fmt.Errorf("amqp091-go alone: %w", err)
	}
	res.Tables = append(res.Tables, Table{Title: "latency at 1,000 events/s, RabbitMQ",
		Columns: []string{"publisher", "measured", "events", "p50 ms", "p99 ms", "max ms"},
		Rows: [][]string{
			{"outbox relay (" + strconv.Itoa(writers) + " writers, " + rate(perSecond(em.events, em.elapsed)) + " ev/s achieved)", "commit to confirm", thousands(em.events), ms(p50), ms(p99), ms(mx)},
			{"amqp091-go alone, same messages and durability", "publish to confirm", thousands(int64(len(alone))), ms(percentile(alone, 50)), ms(percentile(alone, 99)), ms(percentile(alone, 100))},
		}})
	res.metric("amqp.client_latency.1000.p50_ms", float64(percentile(alone, 50))/float64(time.Millisecond))
	res.metric("amqp.client_latency.1000.p99_ms", float64(percentile(alone, 99))/float64(time.Millisecond))
	res.note("a durable queue confirms a persistent message once it is on disk, and RabbitMQ batches those syncs: the amqp091-go row is the server's own floor for this durability")
	res.metric("amqp.latency.1000.p50_ms", float64(p50)/float64(time.Millisecond))
	res.metric("amqp.latency.1000.p99_ms", float64(p99)/float64(time.Millisecond))
	res.target("amqp latency p50 @1,000/s", "<= 5 ms", ms(p50)+" ms", p50 <= 5*time.Millisecond)
	res.target("amqp latency p99 @1,000/s", "<= 20 ms", ms(p99)+" ms", p99 <= 20*time.Millisecond)
	return nil
}

// amqpClientLatency publishes one message a millisecond for window with
// amqp091-go alone, as the relay's are (persistent, mandatory, confirms),
// and returns each one's publish-to-confirm time, sorted.
func amqpClientLatency(ctx context.Context, target *amqpTarget, window time.Duration) ([]time.Duration, error) {
	if err := target.purge(); err != nil {
		return nil, err
	}
	ch, err := target.conn.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 4096))
	n := int(window / time.Millisecond)
	sent := make([]time.Time, n+1)
	var mu sync.Mutex
	agg := uuid.NewString()
	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		for i := 1; i <= n; i++ {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Millisecond)))
			id := strconv.Itoa(i)
			mu.Lock()
			sent[i] = time.Now()
			mu.Unlock()
			err := ch.PublishWithContext(ctx, target.name, "order.placed", true, false, amqp.Publishing{
				Headers:     amqp.Table{outbox.HeaderEventID: id, outbox.HeaderEventType: "order.placed", outbox.HeaderAggregateID: agg},
				ContentType: outbox.ContentTypeJSON, DeliveryMode: amqp.Persistent, MessageId: id, Type: "order.placed", Body: []byte(`{"order_id": 1}`),
			})
			if err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	out := make([]time.Duration, 0, n)
	for range n {
		c, ok := <-confirms
		now := time.Now()
		if !ok || !c.Ack {
			return nil, fmt.Errorf("message %d not confirmed", c.DeliveryTag)
		}
		mu.Lock()
		out = append(out, now.Sub(sent[c.DeliveryTag]))
		mu.Unlock()
	}
	if err := <-errc; err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}
