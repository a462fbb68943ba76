package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// Listener holds one LISTEN connection to a database and wakes the
// relayers of the outboxes it listens for when their producers notify. A
// relayer without one (Config.Listener nil) opens a connection of its own
// for its LISTEN; a process that relays several outboxes of one database
// shares a Listener between them instead, so that the server holds one
// idle connection for all of them, not one each.
//
// While its connection is down the relayers poll (Config.PollInterval),
// as they do without LISTEN; it reconnects with backoff, and wakes them
// all once it listens again (rows may have come meanwhile).
//
//	l := relay.NewListener(pool, logger, ordersTables, billingTables)
//	go l.Run(ctx)
//	r, err := relay.New(relay.Config{Common: relay.Common{Pool: pool, Sink: pub, Tables: ordersTables}, Listener: l})
type Listener struct {
	pool     *pgxpool.Pool
	log      *slog.Logger
	channels []string // LISTENed on each connection, sorted

	mu   sync.Mutex
	subs map[string][]chan<- struct{}
}

// NewListener returns a Listener on pool's database for the outboxes
// tables name (their Channel). It connects when Run runs, with pool's
// connection settings (outside the pool: the connection stays idle in
// LISTEN, and a pooler in transaction mode cannot hold one). logger
// receives its warnings; nil means slog.Default().
func NewListener(pool *pgxpool.Pool, logger *slog.Logger, tables ...outbox.Tables) *Listener {
	if logger == nil {
		logger = slog.Default()
	}
	l := &Listener{pool: pool, log: logger, subs: map[string][]chan<- struct{}{}}
	for _, t := range tables {
		if ch := t.Channel(); !slices.Contains(l.channels, ch) {
			l.channels = append(l.channels, ch)
		}
	}
	slices.Sort(l.channels)
	return l
}

// listens reports whether l listens for t's notifications.
func (l *Listener) listens(t outbox.Tables) bool {
	_, ok := slices.BinarySearch(l.channels, t.Channel())
	return ok
}

// subscribe sends to wake (without blocking) on each notification of
// channel and on each (re)connection; cancel stops it.
func (l *Listener) subscribe(channel string, wake chan<- struct{}) (cancel func()) {
	l.mu.Lock()
	l.subs[channel] = append(l.subs[channel], wake)
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.subs[channel] = slices.DeleteFunc(l.subs[channel], func(c chan<- struct{}) bool { return c == wake })
	}
}

// wake wakes the subscribers of channel, or of every channel when
// channel is "".
func (l *Listener) wake(channel string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch, subs := range l.subs {
		if channel != "" && ch != channel {
			continue
		}
		for _, w := range subs {
			select {
			case w <- struct{}{}:
			default:
			}
		}
	}
}

// Run listens until ctx is cancelled, reconnecting with backoff
// (DefaultBackoffMin to DefaultBackoffMax) when the connection fails.
func (l *Listener) Run(ctx context.Context) {
	l.run(ctx, DefaultBackoffMin, DefaultBackoffMax)
}

func (l *Listener) run(ctx context.Context, lo, hi time.Duration) {
	failures := 0
	for ctx.Err() == nil {
		err := l.listen(ctx, func() { failures = 0 })
		if ctx.Err() != nil {
			return
		}
		failures++
		d := backoff.Delay(lo, hi, failures)
		l.log.Warn("relay listener lost its connection; polling until it is back", "err", err, "channels", len(l.channels), "retry_in", d.Round(time.Millisecond))
		if !backoff.Sleep(ctx, d) {
			return
		}
	}
}

// listen connects, LISTENs on every channel in one round trip, wakes
// every subscriber (calling up once it listens) and then each channel's
// subscribers as notifications come, until the connection fails or ctx
// ends.
func (l *Listener) listen(ctx context.Context, up func()) error {
	if len(l.channels) == 0 {
		<-ctx.Done()
		return ctx.Err()
	}
	conn, err := pgx.ConnectConfig(ctx, l.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	b := &pgx.Batch{}
	for _, ch := range l.channels {
		b.Queue("LISTEN " + pgident.Quote(ch))
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	up()
	l.wake("") // rows may have come while nobody listened
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		l.wake(n.Channel)
	}
}

// errNotListened: Config.Listener does not listen for the relayer's
// outbox.
var errNotListened = errors.New("relay: Config.Listener does not listen for this outbox's notifications; pass its Tables to NewListener")
