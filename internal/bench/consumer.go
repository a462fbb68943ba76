package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// The handler's side effect: one ledger row per order, written in the
// processing transaction.
const ledgerDDL = `CREATE TABLE loyalty_ledger (
  consumer    text   NOT NULL,
  event_id    bigint NOT NULL,
  customer_id text   NOT NULL,
  points      bigint NOT NULL,
  PRIMARY KEY (consumer, event_id)
)`

func ledgerHandler(name string) consumer.Handler {
	return consumer.Typed(func(ctx context.Context, tx pgx.Tx, ev consumer.Event, o order) error {
		_, err := tx.Exec(ctx, "INSERT INTO loyalty_ledger (consumer, event_id, customer_id, points) VALUES ($1, $2, $3, $4)",
			name, ev.ID, o.CustomerID, o.TotalCents/100)
		return err
	})
}

// ledgerBatchHandler is ledgerHandler for a whole batch: every payload
// decoded, the ledger rows written in one INSERT.
func ledgerBatchHandler(name string) consumer.BatchHandler {
	return func(ctx context.Context, tx pgx.Tx, evs []consumer.Event) error {
		ids := make([]int64, len(evs))
		customers := make([]string, len(evs))
		points := make([]int64, len(evs))
		for i, ev := range evs {
			var o order
			if err := json.Unmarshal(ev.Payload, &o); err != nil {
				return consumer.Permanent(fmt.Errorf("event %d: decode %s: %w", ev.ID, ev.Type, err))
			}
			ids[i], customers[i], points[i] = ev.ID, o.CustomerID, o.TotalCents/100
		}
		_, err := tx.Exec(ctx, `INSERT INTO loyalty_ledger (consumer, event_id, customer_id, points)
			SELECT $1, e.id, e.customer, e.points FROM unnest($2::bigint[], $3::text[], $4::bigint[]) AS e(id, customer, points)`,
			name, ids, customers, points)
		return err
	}
}

func benchEvents(n int) ([]consumer.Event, error) {
	evs := make([]consumer.Event, n)
	for i := range evs {
		o := newOrder(i)
		payload, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		evs[i] = consumer.Event{ID: int64(i + 1), Type: "order.placed", AggregateID: o.OrderID, Payload: payload}
	}
	return evs, nil
}

// consumerRun is one path through the consumer the scenario measures.
type consumerRun struct {
	key, name string
	batch     int
}

func runConsumer(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	n := pick(cfg.Short, 2_000, 50_000)
	workers := cfg.Writers
	e, err := s.newEnv(ctx, "consumer", int32(workers))
	if err != nil {
		return nil, err
	}
	defer e.close()
	if err := e.exec(ctx, ledgerDDL); err != nil {
		return nil, err
	}
	evs, err := benchEvents(n)
	if err != nil {
		return nil, err
	}

	res := &Result{}
	res.param("events", "%s distinct events (order.placed, ~200-byte JSON) per run", thousands(int64(n)))
	res.param("handler", "consumer.Typed: decode the payload, INSERT one ledger row, in the transaction that records the event in processed_events")
	res.param("processor", "consumer.Processor (no broker), %d goroutines: Process (one transaction per event) or ProcessBatch", workers)
	res.param("kafka", "consumer.Consumer reading the records from the broker (defaults: BatchSize 100, Concurrency 4), until every event is processed")

	t := Table{Title: "idempotent processing", Columns: []string{"path", "events/s", "seconds", "processed", "duplicates"}}
	runs := []consumerRun{{"single", "Processor.Process, 1 event per tx", 1}, {"batch_100", "Processor.ProcessBatch, 100 per tx", 100}, {"batch_1000", "Processor.ProcessBatch, 1,000 per tx", 1000}}
	if !cfg.Short {
		// The dedupe's own cost: the same batches with a handler that
		// writes nothing.
		runs = append(runs, consumerRun{"batch_1000_noop", "Processor.ProcessBatch, 1,000 per tx, handler writes nothing", 1000})
	}
	runs = append(runs, consumerRun{"batch_1000_bulk", "Processor.ProcessBatchFunc, 1,000 per tx, one INSERT for the batch's ledger rows", 1000})
	for _, r := range runs {
		elapsed, st, err := processorRun(ctx, s, e, evs, workers, r)
		if err != nil {
			return nil, err
		}
		t.Rows = append(t.Rows, []string{r.name, rate(perSecond(int64(n), elapsed)), fmt.Sprintf("%.2f", elapsed.Seconds()), thousands(st.Processed), thousands(st.Duplicates) + " (redelivered)"})
		res.metric("consumer."+r.key+".events_per_s", perSecond(int64(n), elapsed))
		res.metric("consumer."+r.key+".processed", float64(st.Processed))
	}

	for _, r := range []consumerRun{{"kafka_single", "Kafka consumer, BatchSize 1", 1}, {"kafka_batch", "Kafka consumer, defaults (BatchSize 100)", 0}} {
		s.progress("consumer: %s", r.name)
		elapsed, st, err := consumeFromKafka(ctx, s, e, evs, "bench-"+r.key, r.batch)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.name, err)
		}
		t.Rows = append(t.Rows, []string{r.name, rate(perSecond(int64(n), elapsed)), fmt.Sprintf("%.2f", elapsed.Seconds()), thousands(st.Processed), thousands(st.Duplicates)})
		res.metric("consumer."+r.key+".events_per_s", perSecond(int64(n), elapsed))
		res.metric("consumer."+r.key+".processed", float64(st.Processed))
	}
	res.Tables = append(res.Tables, t)
	perEvent := max(res.Metrics["consumer.batch_100.events_per_s"], res.Metrics["consumer.batch_1000.events_per_s"])
	bulk := res.Metrics["consumer.batch_1000_bulk.events_per_s"]
	res.target("idempotent consumer, batched", ">= 20,000 events/s (handler writes one row per event)",
		fmt.Sprintf("%s events/s ProcessBatchFunc (one INSERT per batch); %s ProcessBatch (one INSERT per event); %s through Kafka", rate(bulk), rate(perEvent), rate(res.Metrics["consumer.kafka_batch.events_per_s"])), max(bulk, perEvent) >= 20_000)
	return res, nil
}

// processorRun processes evs with a fresh consumer.Processor the way r
// says, then redelivers them all, and checks that each ran exactly once.
// It returns the first pass's wall time and the processor's counters.
func processorRun(ctx context.Context, s *session, e *env, evs []consumer.Event, workers int, r consumerRun) (time.Duration, consumer.ProcessorStats, error) {
	n := len(evs)
	name := "bench-" + r.key
	p, err := consumer.NewProcessor(consumer.ProcessorConfig{Name: name, Pool: e.pool, Tables: e.tables})
	if err != nil {
		return 0, consumer.ProcessorStats{}, err
	}
	h, bh := ledgerHandler(name), consumer.BatchHandler(nil)
	switch r.key {
	case "batch_1000_noop":
		h = func(context.Context, pgx.Tx, consumer.Event) error { return nil }
	case "batch_1000_bulk":
		bh = ledgerBatchHandler(name)
	}
	s.progress("consumer: %s", r.name)
	elapsed, err := processAll(ctx, p, evs, r.batch, workers, h, bh)
	if err != nil {
		return 0, consumer.ProcessorStats{}, fmt.Errorf("%s: %w", r.name, err)
	}
	// Redeliver everything: nothing may run twice.
	if _, err := processAll(ctx, p, evs, 1000, workers, h, bh); err != nil {
		return 0, consumer.ProcessorStats{}, fmt.Errorf("%s, redelivery: %w", r.name, err)
	}
	st := p.Stats()
	want := int64(n)
	if r.key == "batch_1000_noop" {
		want = 0
	}
	if err := checkLedger(ctx, e, name, want); err != nil {
		return 0, st, fmt.Errorf("%s: %w", r.name, err)
	}
	if st.Processed != int64(n) || st.Duplicates != int64(n) {
		return 0, st, fmt.Errorf("%s: processed %d and skipped %d duplicates; want %d and %d", r.name, st.Processed, st.Duplicates, n, n)
	}
	return elapsed, st, nil
}

// processAll feeds evs to p from `workers` goroutines, `batch` events per
// call (to bh when set, else to h), and returns the wall time.
func processAll(ctx context.Context, p *consumer.Processor, evs []consumer.Event, batch, workers int, h consumer.Handler, bh consumer.BatchHandler) (time.Duration, error) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	chunks := make(chan []consumer.Event)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for c := range chunks {
				var err error
				switch {
				case bh != nil:
					_, err = p.ProcessBatchFunc(ctx, c, bh)
				case batch == 1:
					_, err = p.Process(ctx, c[0], h)
				default:
					_, err = p.ProcessBatch(ctx, c, h)
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := 0; i < len(evs); i += batch {
		chunks <- evs[i:min(len(evs), i+batch)]
	}
	close(chunks)
	wg.Wait()
	if len(errs) > 0 {
		return 0, errs[0]
	}
	return time.Since(start), nil
}

func checkLedger(ctx context.Context, e *env, name string, want int64) error {
	var got int64
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM loyalty_ledger WHERE consumer = $1", name).Scan(&got); err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("the ledger holds %d rows for %s; want exactly %d (one per event)", got, name, want)
	}
	return nil
}

// consumeFromKafka publishes evs to a fresh topic as the relay would, then
// times a Consumer until it has processed them all.
func consumeFromKafka(ctx context.Context, s *session, e *env, evs []consumer.Event, name string, batch int) (time.Duration, consumer.Stats, error) {
	var st consumer.Stats
	b, err := s.startBroker()
	if err != nil {
		return 0, st, err
	}
	defer b.close()
	topic := fmt.Sprintf("bench%s_%s_order", e.id, randomID())
	client, err := kafkapub.NewPublisherClient(b.cfg)
	if err != nil {
		return 0, st, err
	}
	pub := kafkapub.NewPublisher(client, kafkapub.PublisherConfig{})
	for i := 0; i < len(evs); i += 1000 {
		var msgs []relay.Message
		for _, ev := range evs[i:min(len(evs), i+1000)] {
			msgs = append(msgs, relay.Message{ID: ev.ID, AggregateID: ev.AggregateID, Type: ev.Type, Topic: topic, Payload: ev.Payload, CreatedAt: time.Now()})
		}
		for _, err := range pub.Publish(ctx, msgs) {
			if err != nil {
				client.Close()
				return 0, st, fmt.Errorf("publish the input: %w", err)
			}
		}
	}
	client.Close()

	c, err := consumer.New(consumer.Config{
		Name:     name,
		Pool:     e.pool,
		Tables:   e.tables,
		Client:   b.cfg,
		Topics:   []string{topic},
		Handlers: map[string]consumer.Handler{"order.placed": ledgerHandler(name)},
		// The group starts at the earliest offset, as a new consumer
		// group does.
		BatchSize: batch,
		Logger:    s.cfg.Logger,
	})
	if err != nil {
		return 0, st, err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(cctx) }()
	want := int64(len(evs))
	deadline := time.Now().Add(drainTimeout(want))
	var elapsed time.Duration
	for {
		if c.Stats().Processed >= want {
			elapsed = time.Since(start)
			break
		}
		if time.Now().After(deadline) {
			return 0, c.Stats(), fmt.Errorf("consumed %d of %d events within %s", c.Stats().Processed, want, drainTimeout(want))
		}
		select {
		case err := <-done:
			return 0, c.Stats(), fmt.Errorf("the consumer stopped: %v", err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			return 0, c.Stats(), fmt.Errorf("the consumer stopped with %w", err)
		}
	case <-time.After(30 * time.Second):
		return 0, c.Stats(), fmt.Errorf("the consumer did not stop within 30s")
	}
	st = c.Stats()
	if st.DeadLettered != 0 {
		return 0, st, fmt.Errorf("%d records dead-lettered", st.DeadLettered)
	}
	return elapsed, st, checkLedger(ctx, e, name, want)
}
