// Package demo runs the seed scenario end to end: orders placed by
// concurrent writers (some rolled back by a duplicate order id), two
// relayers, the loyalty consumer, a forced redelivery, and a report that
// checks every invariant. `outbox demo` is its command-line form.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/examples/orders/shop"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
)

// Config configures a run. The zero value is a sensible demo.
type Config struct {
	// DatabaseURL; "" uses libpq defaults. When no server answers and
	// initdb/pg_ctl are on the PATH, a throwaway cluster is started.
	DatabaseURL string
	// NoThrowaway never starts a throwaway cluster.
	NoThrowaway bool
	// Brokers; empty starts an in-process dev broker.
	Brokers kafka.ClientConfig
	// Sink, when set, is the broker instead of Kafka (Brokers is then
	// not used).
	Sink *Sink
	// Orders to attempt. Defaults to 400.
	Orders int
	// Writers placing orders concurrently. Defaults to 8.
	Writers int
	// DuplicateEvery: every Nth order reuses an existing order id and
	// rolls back. Defaults to 10.
	DuplicateEvery int
	// Redeliver is how many dispatched events are forced out again.
	// Defaults to 10% of the orders.
	Redeliver int
	// Timeout bounds the whole run. Defaults to 2m.
	Timeout time.Duration
	// KeepSchema leaves the demo schema in place for inspection, and, on
	// an external cluster (Brokers), the demo's topics too. Without it the
	// run deletes the topics it used: their names carry the schema's, so
	// every run would leave two more.
	KeepSchema bool
	// Out receives the progress line and the report. Defaults to io.Discard.
	Out io.Writer
	// Progress enables the live progress line (\r-rewritten).
	Progress bool
	// Logger for the relayers and the consumer. Defaults to warnings only.
	Logger *slog.Logger
	// OnConnect, when set, is called with the connection settings of the
	// server the demo works on, once it answered (the configured one, or
	// the throwaway cluster): the CLI logs which database it used.
	OnConnect func(*pgconn.Config)
}

// Report is what a run found.
type Report struct {
	Database, Broker, Schema                 string
	OrdersAttempted, OrdersCommitted         int64
	OrdersRolledBack                         int64
	EventsEmitted, EventsInOutbox            int64
	Published                                int64 // acknowledged by the broker, redeliveries included
	Consumed, DuplicatesSkipped, DeadLetters int64
	Redelivered                              int64
	// ServerDedupes: the broker drops redelivered copies by their id
	// (Sink.Dedupes), so none reaches the consumer.
	ServerDedupes          bool
	Points                 shop.Points
	LagP50, LagP99, LagMax time.Duration
	Elapsed                time.Duration
	// Failures lists broken invariants; empty means the run passed.
	Failures []string
}

// OK reports whether every invariant held.
func (r Report) OK() bool { return len(r.Failures) == 0 }

// Run executes the demo.
func Run(ctx context.Context, cfg Config) (Report, error) {
	start := time.Now()
	cfg = withDefaults(cfg)
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	d := &demo{cfg: cfg, out: cfg.Out}
	defer d.cleanUp()

	for _, step := range []func(context.Context) error{
		d.openDatabase,    // Postgres: the configured server, else a throwaway cluster
		d.createSchema,    // a schema of its own, migrated, dropped at the end
		d.openBroker,      // the Sink, else Kafka: the configured cluster, else a dev broker
		d.startServices,   // two relayers and the loyalty consumer
		d.placeOrders,     // concurrent writers, some rolled back
		d.awaitDelivery,   // every committed order consumed
		d.redeliver,       // dispatched rows forced out again, skipped as duplicates
		d.stopServices,    // relayers and consumer stopped
		d.checkInvariants, // gather the figures and check them
	} {
		if err := step(ctx); err != nil {
			return d.rep, err
		}
	}
	d.rep.Elapsed = time.Since(start)
	return d.rep, nil
}

// demo is the state of one Run, shared by its steps.
type demo struct {
	cfg Config
	out io.Writer
	rep Report
	// undo holds what Run's deferred cleanUp undoes, last first, as
	// defers would.
	undo []func()

	admin    *pgxpool.Pool // the server's, for the schema itself
	url      string
	pool     *pgxpool.Pool // searching the demo schema
	tables   outbox.Tables
	kcfg     kafka.ClientConfig
	prefix   string // of topic names
	producer *outbox.Producer

	gctx      context.Context // the relayers' and the consumer's group
	g         *errgroup.Group
	stopRun   context.CancelFunc
	relayers  []*relay.Relayer
	cons      loyalty
	tick      *time.Ticker
	lagMu     sync.Mutex
	lags      []time.Duration
	measuring atomic.Bool // lag is measured on first deliveries only

	attempted, committed, rolledBack atomic.Int64
	lastLine                         time.Time
}

// deferred adds f to what cleanUp undoes.
// lagHook records the relayers' latencies while the demo measures.
type lagHook struct{ d *demo }

func (h lagHook) OnBatch(b relay.BatchResult) {
	if !h.d.measuring.Load() {
		return
	}
	h.d.lagMu.Lock()
	h.d.lags = append(h.d.lags, b.Latencies...)
	h.d.lagMu.Unlock()
}

func (d *demo) deferred(f func()) { d.undo = append(d.undo, f) }

// cleanUp undoes what the steps set up, last first.
func (d *demo) cleanUp() {
	for i := len(d.undo) - 1; i >= 0; i-- {
		d.undo[i]()
	}
}

// openDatabase connects to the configured server, else starts a throwaway
// cluster.
func (d *demo) openDatabase(ctx context.Context) error {
	cfg, out := d.cfg, d.out
	url := cfg.DatabaseURL
	admin, where, err := connect(ctx, url, cfg.OnConnect)
	if err != nil {
		if cfg.NoThrowaway || !tmppg.Available() {
			return fmt.Errorf("%w; start Postgres or set DATABASE_URL (or install initdb/pg_ctl so the demo can start its own)", err)
		}
		fmt.Fprintf(out, "no Postgres answered (%s); starting a throwaway cluster\n", err)
		cluster, cerr := tmppg.Start(ctx)
		if cerr != nil {
			return fmt.Errorf("%w; and a throwaway cluster failed: %w", err, cerr)
		}
		d.deferred(func() {
			if err := cluster.Stop(); err != nil {
				fmt.Fprintln(out, "warning:", err)
			}
		})
		url = cluster.URL()
		if admin, where, err = connect(ctx, url, cfg.OnConnect); err != nil {
			return err
		}
	}
	d.deferred(admin.Close)
	d.admin, d.url = admin, url
	d.rep.Database = where
	return nil
}

// createSchema creates the demo's own schema (dropped at the end unless
// KeepSchema), connects the pool to it and migrates it.
func (d *demo) createSchema(ctx context.Context) error {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	schema := "outbox_demo_" + hex.EncodeToString(rnd[:])
	d.rep.Schema = schema
	if _, err := d.admin.Exec(ctx, "CREATE SCHEMA "+pgident.Quote(schema)); err != nil {
		return fmt.Errorf("create schema %s: %w", schema, err)
	}
	if !d.cfg.KeepSchema {
		d.deferred(func() {
			dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer dcancel()
			if _, err := d.admin.Exec(dctx, "DROP SCHEMA "+pgident.Quote(schema)+" CASCADE"); err != nil {
				fmt.Fprintln(d.out, "warning: drop demo schema:", err)
			}
		})
	}
	pcfg, err := pgxpool.ParseConfig(d.url)
	if err != nil {
		return err
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = schema
	pcfg.MaxConns = int32(d.cfg.Writers + 8)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	d.deferred(pool.Close)
	d.pool = pool
	d.tables = outbox.Tables{Schema: schema}.WithDefaults()
	m, err := migrate.New(d.tables)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx, pool); err != nil {
		return err
	}
	return shop.Migrate(ctx, pool)
}

// openKafka connects to the configured cluster, else starts an in-process
// dev broker, and creates the topics.
func (d *demo) openKafka(ctx context.Context) error {
	kcfg := d.cfg.Brokers
	external := len(kcfg.Brokers) > 0
	if !external {
		b, err := devkafka.Start(devkafka.Config{Partitions: 6})
		if err != nil {
			return err
		}
		d.deferred(b.Close)
		kcfg.Brokers = []string{b.Addr()}
		d.rep.Broker = "embedded dev broker at " + b.Addr()
	} else {
		d.rep.Broker = strings.Join(kcfg.Brokers, ",")
	}
	d.kcfg = kcfg
	// Topic names carry the schema, so reruns against one real cluster do
	// not read each other's events.
	d.prefix = d.rep.Schema + "."
	topics := []string{d.prefix + shop.Topic, d.prefix + shop.Topic + ".dlq"}
	if external && !d.cfg.KeepSchema {
		// Registered before the topics are created, so a run that fails
		// half way deletes what it made (or the broker auto-created) too.
		// The names are this run's own: nobody else's topic can match.
		d.deferred(func() {
			dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer dcancel()
			if err := deleteTopics(dctx, kcfg, topics...); err != nil {
				fmt.Fprintf(d.out, "warning: could not delete the demo's topics %s: %s\n", strings.Join(topics, ", "), err)
			} else {
				fmt.Fprintf(d.out, "deleted the demo's topics %s (--keep keeps them)\n", strings.Join(topics, ", "))
			}
			// The consumer has left its group by now (the services
			// stopped before this runs): its committed offsets go too.
			group := d.consumerName()
			if err := deleteGroup(dctx, kcfg, group); err != nil {
				fmt.Fprintf(d.out, "warning: could not delete the demo's consumer group %s: %s\n", group, err)
				return
			}
			fmt.Fprintf(d.out, "deleted the demo's consumer group %s\n", group)
		})
	}
	fmt.Fprintf(d.out, "database %s, schema %s\nbroker   %s\n", d.rep.Database, d.rep.Schema, d.rep.Broker)
	// Create the topics up front, as an operator would, so the first
	// batch's latency is not the broker creating a topic.
	if err := createTopics(ctx, kcfg, topics...); err != nil {
		fmt.Fprintf(d.out, "warning: could not create topics (%s); relying on auto-creation\n", err)
	}
	return nil
}

// startServices starts two relayers and the loyalty consumer; they run
// until stopServices.
func (d *demo) startServices(ctx context.Context) error {
	// Lag is measured on first deliveries only: a forced redelivery's
	// created_at is long past, and would read as lag.
	d.measuring.Store(true)
	runCtx, stopRun := context.WithCancel(ctx)
	d.deferred(stopRun)
	d.stopRun = stopRun
	g, gctx := errgroup.WithContext(runCtx)
	d.g, d.gctx = g, gctx
	// The consumer first: a webhook endpoint must listen before the
	// relayers send to it.
	cons, err := d.newLoyalty(ctx)
	if err != nil {
		return err
	}
	d.cons = cons
	g.Go(func() error { return cons.Run(gctx) })
	for i := range 2 {
		sink, err := d.newSink(ctx)
		if err != nil {
			return err
		}
		if i == 0 {
			if err := d.newProducer(sink); err != nil {
				return err
			}
		}
		r, err := relay.New(relay.Config{
			Common: relay.Common{Pool: d.pool, Sink: sink, Tables: d.tables, TopicPrefix: d.prefix, Logger: d.cfg.Logger.With("relayer", i+1),
				Hooks: []relay.Hook{lagHook{d}}},
			PollInterval: 200 * time.Millisecond,
		})
		if err != nil {
			return err
		}
		d.relayers = append(d.relayers, r)
		g.Go(func() error { return r.Run(gctx) })
	}
	return nil
}

// serverDedupes reports whether the broker drops the forced redeliveries.
func (d *demo) serverDedupes() bool { return d.cfg.Sink != nil && d.cfg.Sink.Dedupes }

// published is how many events the relayers have had acknowledged.
func (d *demo) published() int64 {
	var n int64
	for _, r := range d.relayers {
		n += r.Stats().Dispatched
	}
	return n
}

// progress writes the progress line, if enabled.
func (d *demo) progress(phase string) {
	if !d.cfg.Progress {
		return
	}
	s := d.cons.counts()
	line := fmt.Sprintf("%-12s orders %d/%d (%d rolled back)  published %d  consumed %d  duplicates %d",
		phase, d.attempted.Load(), d.cfg.Orders, d.rolledBack.Load(), d.published(), s.processed, s.duplicates)
	if isTerminal(d.out) {
		fmt.Fprintf(d.out, "\r%s   ", line)
	} else if time.Since(d.lastLine) >= time.Second {
		// Logs get a line a second, not a carriage-return smear.
		fmt.Fprintln(d.out, line)
		d.lastLine = time.Now()
	}
}

// placeOrders places orders from concurrent writers; every
// DuplicateEvery-th order reuses a committed order's id, fails on the
// primary key and rolls back, taking its event with it.
func (d *demo) placeOrders(ctx context.Context) error {
	cfg := d.cfg
	var (
		idsMu sync.Mutex
		ids   []uuid.UUID
	)
	customers := make([]uuid.UUID, 25)
	for i := range customers {
		customers[i] = uuid.New()
	}
	next := atomic.Int64{}
	wg := errgroup.Group{}
	for range cfg.Writers {
		wg.Go(func() error {
			for {
				n := next.Add(1)
				if n > int64(cfg.Orders) {
					return nil
				}
				o := shop.Order{ID: uuid.New(), CustomerID: customers[mrand.IntN(len(customers))], TotalCents: 100 + mrand.Int64N(20_000)}
				dup := n%int64(cfg.DuplicateEvery) == 0
				if dup {
					idsMu.Lock()
					if len(ids) > 0 {
						o.ID = ids[mrand.IntN(len(ids))]
					}
					idsMu.Unlock()
				}
				d.attempted.Add(1)
				_, err := shop.PlaceOrder(ctx, d.pool, d.producer, o)
				switch {
				case err == nil:
					d.committed.Add(1)
					idsMu.Lock()
					ids = append(ids, o.ID)
					idsMu.Unlock()
				case shop.IsDuplicate(err):
					d.rolledBack.Add(1)
				default:
					return fmt.Errorf("place order: %w", err)
				}
			}
		})
	}
	d.tick = time.NewTicker(200 * time.Millisecond)
	d.deferred(d.tick.Stop)
	placed := make(chan error, 1)
	go func() { placed <- wg.Wait() }()
waitPlaced:
	for {
		select {
		case err := <-placed:
			if err != nil {
				return err
			}
			break waitPlaced
		case <-d.tick.C:
			d.progress("placing")
		case <-ctx.Done():
			return fmt.Errorf("placing orders: %w", ctx.Err())
		}
	}
	d.rep.OrdersAttempted, d.rep.OrdersCommitted, d.rep.OrdersRolledBack = d.attempted.Load(), d.committed.Load(), d.rolledBack.Load()
	return nil
}

// waitFor waits until cond holds, writing progress.
func (d *demo) waitFor(ctx context.Context, phase string, cond func() bool) error {
	for !cond() {
		select {
		case <-d.tick.C:
			d.progress(phase)
		case <-d.gctx.Done():
			return fmt.Errorf("%s: a relayer or the consumer stopped: %w", phase, context.Cause(d.gctx))
		case <-ctx.Done():
			return fmt.Errorf("%s: timed out after %s", phase, d.cfg.Timeout)
		}
	}
	d.progress(phase)
	return nil
}

// awaitDelivery waits until the consumer has processed every committed
// order's event.
func (d *demo) awaitDelivery(ctx context.Context) error {
	return d.waitFor(ctx, "delivering", func() bool { return d.cons.counts().processed >= d.rep.OrdersCommitted })
}

// redeliver forces a redelivery, as a relayer crash between publish and
// mark would: it sets some dispatched rows back to pending. The relayers
// publish them again; the consumer must skip them.
func (d *demo) redeliver(ctx context.Context) error {
	d.measuring.Store(false)
	tag, err := d.pool.Exec(ctx, "UPDATE "+d.tables.OutboxIdent()+" SET dispatched_at = NULL WHERE id IN (SELECT id FROM "+d.tables.OutboxIdent()+" ORDER BY random() LIMIT $1)", d.cfg.Redeliver)
	if err != nil {
		return fmt.Errorf("force redelivery: %w", err)
	}
	d.rep.Redelivered = tag.RowsAffected()
	before, published := d.cons.counts().duplicates, d.published()
	done := func() bool { return d.cons.counts().duplicates-before >= d.rep.Redelivered }
	if d.serverDedupes() {
		done = func() bool { return d.published()-published >= d.rep.Redelivered }
	}
	if err := d.waitFor(ctx, "redelivering", done); err != nil {
		return err
	}
	// Let stragglers (a record published twice by the at-least-once path)
	// show up before counting.
	time.Sleep(300 * time.Millisecond)
	if d.cfg.Progress && isTerminal(d.out) {
		fmt.Fprintln(d.out)
	}
	return nil
}

// stopServices stops the relayers and the consumer and waits for them.
func (d *demo) stopServices(context.Context) error {
	d.stopRun()
	if err := d.g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("relayer or consumer failed: %w", err)
	}
	return nil
}

// checkInvariants gathers the figures into the report and records every
// broken invariant in its Failures.
func (d *demo) checkInvariants(ctx context.Context) error {
	rep := &d.rep
	s := d.cons.counts()
	rep.Published, rep.Consumed, rep.DuplicatesSkipped, rep.DeadLetters = d.published(), s.processed, s.duplicates, s.deadLettered
	if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM "+d.tables.OutboxIdent()).Scan(&rep.EventsInOutbox); err != nil {
		return err
	}
	rep.EventsEmitted = rep.OrdersCommitted
	var err error
	if rep.Points, err = shop.CheckPoints(ctx, d.pool); err != nil {
		return err
	}
	var pending int64
	if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM "+d.tables.OutboxIdent()+" WHERE dispatched_at IS NULL").Scan(&pending); err != nil {
		return err
	}
	rep.LagP50, rep.LagP99, rep.LagMax = percentiles(d.lags)
	check := func(ok bool, format string, args ...any) {
		if !ok {
			rep.Failures = append(rep.Failures, fmt.Sprintf(format, args...))
		}
	}
	check(rep.OrdersRolledBack > 0, "no order was rolled back; the duplicate path was not exercised")
	check(rep.EventsInOutbox == rep.OrdersCommitted, "%d events in the outbox for %d committed orders (atomic emit)", rep.EventsInOutbox, rep.OrdersCommitted)
	check(pending == 0, "%d events still pending (no loss)", pending)
	check(rep.Published >= rep.OrdersCommitted+rep.Redelivered, "published %d < %d committed + %d redelivered", rep.Published, rep.OrdersCommitted, rep.Redelivered)
	check(rep.Consumed == rep.OrdersCommitted, "consumed %d events for %d committed orders (exactly-once effects)", rep.Consumed, rep.OrdersCommitted)
	rep.ServerDedupes = d.serverDedupes()
	check(rep.DuplicatesSkipped >= rep.Redelivered || rep.ServerDedupes, "skipped %d duplicates, %d were redelivered", rep.DuplicatesSkipped, rep.Redelivered)
	check(rep.DeadLetters == 0, "%d records dead-lettered", rep.DeadLetters)
	check(rep.Points.OK(), "loyalty points wrong: %s", rep.Points)
	check(rep.Points.Orders == rep.OrdersCommitted, "orders table holds %d orders, %d committed", rep.Points.Orders, rep.OrdersCommitted)
	return nil
}

// Print writes the report.
func (r Report) Print(w io.Writer) {
	ok := func(b bool) string {
		if b {
			return "ok"
		}
		return "FAIL"
	}
	fmt.Fprintf(w, "\noutbox demo report (%s)\n", r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "  orders attempted        %6d\n", r.OrdersAttempted)
	fmt.Fprintf(w, "  orders committed        %6d\n", r.OrdersCommitted)
	fmt.Fprintf(w, "  orders rolled back      %6d   (duplicate order id: no event may exist)\n", r.OrdersRolledBack)
	fmt.Fprintf(w, "  events emitted          %6d   in outbox: %d  %s\n", r.EventsEmitted, r.EventsInOutbox, ok(r.EventsEmitted == r.EventsInOutbox))
	fmt.Fprintf(w, "  events published        %6d   (%d forced redeliveries included)\n", r.Published, r.Redelivered)
	fmt.Fprintf(w, "  events consumed         %6d   %s\n", r.Consumed, ok(r.Consumed == r.OrdersCommitted))
	if r.ServerDedupes {
		fmt.Fprintf(w, "  duplicates skipped      %6d   ok (the broker dropped the redelivered copies by their message id)\n", r.DuplicatesSkipped)
	} else {
		fmt.Fprintf(w, "  duplicates skipped      %6d   %s\n", r.DuplicatesSkipped, ok(r.DuplicatesSkipped >= r.Redelivered))
	}
	fmt.Fprintf(w, "  dead letters            %6d\n", r.DeadLetters)
	fmt.Fprintf(w, "  loyalty points          %6d awarded, %d expected  %s\n", r.Points.Awarded, r.Points.Expected, ok(r.Points.OK()))
	fmt.Fprintf(w, "  dispatch lag            p50 %s  p99 %s  max %s (commit to broker ack)\n",
		r.LagP50.Round(100*time.Microsecond), r.LagP99.Round(100*time.Microsecond), r.LagMax.Round(100*time.Microsecond))
	if r.OK() {
		fmt.Fprintln(w, "all invariants hold")
		return
	}
	for _, f := range r.Failures {
		fmt.Fprintln(w, "FAIL:", f)
	}
}

func withDefaults(c Config) Config {
	if c.Orders <= 0 {
		c.Orders = 400
	}
	if c.Writers <= 0 {
		c.Writers = 8
	}
	if c.DuplicateEvery <= 1 {
		c.DuplicateEvery = 10
	}
	if c.Redeliver <= 0 {
		c.Redeliver = max(1, c.Orders/10)
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Minute
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(c.Out, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return c
}

func connect(ctx context.Context, url string, onConnect func(*pgconn.Config)) (*pgxpool.Pool, string, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, "", fmt.Errorf("bad database URL: %w", err)
	}
	cfg.MaxConns = 2
	where := fmt.Sprintf("%s:%d/%s as %s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, cfg.ConnConfig.User)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, where, err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, where, fmt.Errorf("the Postgres server at %s does not answer: %s", where, strings.Join(strings.Fields(err.Error()), " "))
	}
	if onConnect != nil {
		onConnect(&cfg.ConnConfig.Config)
	}
	return pool, where, nil
}

func percentiles(ds []time.Duration) (p50, p99, maxD time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ds)
	at := func(q float64) time.Duration {
		return ds[int(math.Ceil(q*float64(len(ds))))-1]
	}
	return at(0.50), at(0.99), ds[len(ds)-1]
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// admin is an admin client of the cluster; Close closes its client.
func admin(kcfg kafka.ClientConfig) (*kadm.Client, error) {
	opts, err := kcfg.Options()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	return kadm.NewClient(cl), nil
}

func createTopics(ctx context.Context, kcfg kafka.ClientConfig, topics ...string) error {
	adm, err := admin(kcfg)
	if err != nil {
		return err
	}
	defer adm.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := adm.CreateTopics(cctx, 6, -1, nil, topics...)
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("%s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

// consumerName is the loyalty consumer's name, and its Kafka group: this
// run's own, as the schema is.
func (d *demo) consumerName() string { return shop.LoyaltyConsumer + "-" + d.rep.Schema }

// deleteGroup deletes a consumer group from the cluster; a group that
// does not exist (the consumer never joined) is no error.
func deleteGroup(ctx context.Context, kcfg kafka.ClientConfig, group string) error {
	adm, err := admin(kcfg)
	if err != nil {
		return err
	}
	defer adm.Close()
	res, err := adm.DeleteGroup(ctx, group)
	if err != nil {
		return err
	}
	if res.Err != nil && !errors.Is(res.Err, kerr.GroupIDNotFound) {
		return res.Err
	}
	return nil
}

// deleteTopics deletes topics from the cluster; a topic that does not
// exist (never created, auto-creation off) is no error.
func deleteTopics(ctx context.Context, kcfg kafka.ClientConfig, topics ...string) error {
	adm, err := admin(kcfg)
	if err != nil {
		return err
	}
	defer adm.Close()
	res, err := adm.DeleteTopics(ctx, topics...)
	if err != nil {
		return err
	}
	for _, r := range res.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.UnknownTopicOrPartition) {
			return fmt.Errorf("%s: %w", r.Topic, r.Err)
		}
	}
	return nil
}
