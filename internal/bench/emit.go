package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
)

// order is the business row and the event payload of the emit scenarios.
type order struct {
	OrderID    uuid.UUID   `json:"order_id"`
	CustomerID string      `json:"customer_id"`
	TotalCents int64       `json:"total_cents"`
	Currency   string      `json:"currency"`
	Items      []orderItem `json:"items"`
}

type orderItem struct {
	SKU        string `json:"sku"`
	Qty        int    `json:"qty"`
	PriceCents int64  `json:"price_cents"`
}

func newOrder(i int) order {
	return order{
		OrderID:    uuid.New(),
		CustomerID: fmt.Sprintf("customer-%d", i%1000),
		TotalCents: int64(i*7919) % 100000,
		Currency:   "EUR",
		Items:      []orderItem{{SKU: fmt.Sprintf("SKU-%d", i%97), Qty: 1 + i%5, PriceCents: 1999}},
	}
}

const ordersDDL = `CREATE TABLE orders (
  id          uuid PRIMARY KEY,
  customer_id text NOT NULL,
  total_cents bigint NOT NULL,
  currency    text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now()
)`

const insertOrderSQL = `INSERT INTO orders (id, customer_id, total_cents, currency) VALUES ($1, $2, $3, $4)`

// emitVariant is one shape of business transaction.
type emitVariant struct {
	key, name string
	events    int  // events per transaction
	batch     bool // one EmitBatch rather than `events` Emit calls
	queue     bool // QueueEmit, sent with the INSERT in one pgx.Batch
	big       bool // the ~1 kB payload (bigOrder) instead of the ~200-byte one
	cfg       outbox.Config
}

func runEmit(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	rounds, window := pick(cfg.Short, 1, 3), pick(cfg.Short, 300*time.Millisecond, 3*time.Second)
	e, err := s.newEnv(ctx, "emit", int32(cfg.Writers))
	if err != nil {
		return nil, err
	}
	defer e.close()
	if err := e.exec(ctx, ordersDDL); err != nil {
		return nil, err
	}

	res := &Result{}
	res.param("writers", "%d concurrent transactions", cfg.Writers)
	res.param("window", "%d rounds of %s per variant, variants interleaved; the median round is reported", rounds, window)
	res.param("transaction", "BEGIN; INSERT INTO orders; [Emit order.placed, ~200-byte JSON payload]; COMMIT (QueueEmit: BEGIN; [INSERT + QueueEmit in one pgx.Batch]; COMMIT)")

	set, err := loadBenchContracts()
	if err != nil {
		return nil, err
	}
	size, check, err := checkCost(set, pick(cfg.Short, 2000, 20000))
	if err != nil {
		return nil, err
	}
	res.param("contracts", "the ~1 kB variants: a %d-byte order.placed payload; with contracts, Emit checks it against internal/bench/contracts (JSON Schema 2020-12: 16 properties, nested objects by $ref, enums, patterns, bounds)", size)
	variants := emitVariants(e.tables, set)
	samples := make([][]emitSample, len(variants))
	producers := make([]*outbox.Producer, len(variants))
	for i, v := range variants {
		if v.events > 0 {
			if producers[i], err = outbox.NewProducer(v.cfg); err != nil {
				return nil, err
			}
		}
	}
	var totalTx, totalEvents int64
	for round := range rounds {
		for i, v := range variants {
			s.progress("emit: round %d/%d: %s", round+1, rounds, v.name)
			txs, lat, elapsed, err := runEmitters(ctx, e, cfg.Writers, window, emitTx(producers[i], v))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			samples[i] = append(samples[i], emitSample{txs: txs, events: txs * int64(v.events), dur: elapsed, lat: lat})
			totalTx += txs
			totalEvents += txs * int64(v.events)
		}
	}
	if err := checkEmitted(ctx, e, totalTx, totalEvents); err != nil {
		return nil, err
	}
	res.metric("emit.transactions", float64(totalTx))
	res.metric("emit.events", float64(totalEvents))
	emitTable(res, variants, samples)
	emitContractsTarget(res, check)
	r, q := res.Metrics["emit.emit.ratio"], res.Metrics["emit.queue.ratio"]
	res.target("emit cost", ">= 0.80x tx/s of the same tx without Emit",
		fmt.Sprintf("%.2fx with Emit (a round trip of its own), %.2fx with QueueEmit (none); NOTIFY on every transaction: %.2fx", r, q, res.Metrics["emit.emit_notify_every.ratio"]), max(r, q) >= 0.8)
	res.note("commits wait for the WAL flush (fsync=%s, synchronous_commit=%s, wal_sync_method=%s); concurrent commits share a flush (group commit) unless they NOTIFY: Postgres holds a database-wide lock from a notifying transaction's pre-commit until its commit is flushed, so notifying commits flush one at a time, which is why a Producer notifies at most once per NotifyInterval",
		setting(ctx, e, "fsync"), setting(ctx, e, "synchronous_commit"), setting(ctx, e, "wal_sync_method"))
	return res, nil
}

// emitVariants are the shapes of business transaction the emit scenario
// compares, the first without Emit: the base of the ratios.
func emitVariants(tables outbox.Tables, set outbox.Contracts) []emitVariant {
	return []emitVariant{
		{key: "none", name: "orders insert only (no Emit)"},
		{key: "emit", name: "+ Emit (defaults: NOTIFY at most every 10 ms, aggregate lock on)", events: 1, cfg: outbox.Config{Tables: tables}},
		{key: "queue", name: "+ QueueEmit, sent with the INSERT in one pgx.Batch (defaults)", events: 1, queue: true, cfg: outbox.Config{Tables: tables}},
		{key: "emit_notify_every", name: "+ Emit, NOTIFY on every transaction", events: 1, cfg: outbox.Config{Tables: tables, NotifyInterval: -1}},
		{key: "emit_nonotify", name: "+ Emit, NOTIFY off", events: 1, cfg: outbox.Config{Tables: tables, DisableNotify: true}},
		{key: "emit_nonotify_nolock", name: "+ Emit, NOTIFY off, aggregate lock off", events: 1, cfg: outbox.Config{Tables: tables, DisableNotify: true, DisableAggregateLock: true}},
		{key: "emit10", name: "+ 10 x Emit", events: 10, cfg: outbox.Config{Tables: tables}},
		{key: "emitbatch10", name: "+ EmitBatch of 10", events: 10, batch: true, cfg: outbox.Config{Tables: tables}},
		{key: "emit_1k", name: "+ Emit, ~1 kB payload", events: 1, big: true, cfg: outbox.Config{Tables: tables}},
		{key: "emit_1k_contracts", name: "+ Emit, ~1 kB payload checked against its contract", events: 1, big: true, cfg: outbox.Config{Tables: tables, Contracts: set}},
	}
}

// emitContractsTarget adds the contract check's target: Emit of the ~1 kB
// payload with contracts against the same Emit without, in the same run;
// check is the time of one contracts.Set.Check, in process.
func emitContractsTarget(res *Result, check time.Duration) {
	without, with := res.Metrics["emit.emit_1k.tx_per_s"], res.Metrics["emit.emit_1k_contracts.tx_per_s"]
	cost := without / with
	res.metric("emit.contracts.cost_ratio", cost)
	res.metric("emit.contracts.check_us", float64(check.Nanoseconds())/1e3)
	res.target("contract check at Emit", "<= 1.15x the cost of the same Emit without contracts (~1 kB payload)",
		fmt.Sprintf("%.2fx (%s vs %s tx/s; one check %.1f µs in process)", cost, rate(with), rate(without), float64(check.Nanoseconds())/1e3), cost <= 1.15)
}

// emitSample is one round of one variant.
type emitSample struct {
	txs, events int64
	dur         time.Duration
	lat         []time.Duration
}

// emitTx is the business transaction of variant v, emitting through p (nil
// when v emits nothing).
func emitTx(p *outbox.Producer, v emitVariant) func(ctx context.Context, tx pgx.Tx, n int) error {
	return func(ctx context.Context, tx pgx.Tx, n int) error {
		o := newOrder(n)
		var payload any = o
		if v.big {
			payload = newBigOrder(n, o)
		}
		if v.queue {
			batch := &pgx.Batch{}
			batch.Queue(insertOrderSQL, o.OrderID, o.CustomerID, o.TotalCents, o.Currency)
			if _, err := p.QueueEmit(ctx, batch, outbox.Event{AggregateID: o.OrderID, Type: "order.placed", Payload: payload}); err != nil {
				return err
			}
			return tx.SendBatch(ctx, batch).Close()
		}
		if _, err := tx.Exec(ctx, insertOrderSQL, o.OrderID, o.CustomerID, o.TotalCents, o.Currency); err != nil {
			return err
		}
		switch {
		case v.events == 0:
			return nil
		case v.batch:
			evs := make([]outbox.Event, v.events)
			for k := range evs {
				evs[k] = outbox.Event{AggregateID: o.OrderID, Type: "order.placed", Payload: payload}
			}
			_, err := p.EmitBatch(ctx, tx, evs)
			return err
		}
		for range v.events {
			if _, err := p.Emit(ctx, tx, outbox.Event{AggregateID: o.OrderID, Type: "order.placed", Payload: payload}); err != nil {
				return err
			}
		}
		return nil
	}
}

// checkEmitted checks that every committed transaction left its order and
// its events, and nothing else is there.
func checkEmitted(ctx context.Context, e *env, totalTx, totalEvents int64) error {
	var orders int64
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&orders); err != nil {
		return err
	}
	events, err := e.count(ctx, "true")
	if err != nil {
		return err
	}
	if orders != totalTx || events != totalEvents {
		return fmt.Errorf("committed %d transactions with %d events, but the tables hold %d orders and %d events", totalTx, totalEvents, orders, events)
	}
	return nil
}

// emitTable adds the variants' table and metrics to res.
func emitTable(res *Result, variants []emitVariant, samples [][]emitSample) {
	t := Table{Title: "business transactions", Columns: []string{"variant", "tx/s", "events/s", "vs no Emit", "tx p50 ms", "tx p99 ms"}}
	var base float64
	for i, v := range variants {
		var txps, evps []float64
		var lat []time.Duration
		for _, sm := range samples[i] {
			txps = append(txps, perSecond(sm.txs, sm.dur))
			evps = append(evps, perSecond(sm.events, sm.dur))
			lat = append(lat, sm.lat...)
		}
		slices.Sort(lat)
		tx := median(txps)
		if i == 0 {
			base = tx
		}
		t.Rows = append(t.Rows, []string{v.name, rate(tx), rate(median(evps)), ratio(tx / base), ms(percentile(lat, 50)), ms(percentile(lat, 99))})
		res.metric("emit."+v.key+".tx_per_s", tx)
		res.metric("emit."+v.key+".events_per_s", median(evps))
		res.metric("emit."+v.key+".ratio", tx/base)
	}
	res.Tables = append(res.Tables, t)
}

func setting(ctx context.Context, e *env, name string) string {
	var v string
	if err := e.pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
		return "?"
	}
	return v
}

// runEmitters runs fn in a transaction from `writers` goroutines until
// window has passed and returns how many transactions committed, their
// latencies and the time it took.
func runEmitters(ctx context.Context, e *env, writers int, window time.Duration, fn func(ctx context.Context, tx pgx.Tx, n int) error) (int64, []time.Duration, time.Duration, error) {
	var (
		mu   sync.Mutex
		lat  []time.Duration
		errs []error
		wg   sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(window)
	for w := range writers {
		wg.Go(func() {
			var mine []time.Duration
			for n := w; time.Now().Before(deadline); n += writers {
				t0 := time.Now()
				if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return fn(ctx, tx, n) }); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(errs) > 0 {
		return 0, nil, 0, errs[0]
	}
	return int64(len(lat)), lat, elapsed, nil
}
