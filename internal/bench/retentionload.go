package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
)

// The business load of the cleanup scenario: a few writers, each
// transaction an UPDATE of an account row and one Emit, paced at a fixed
// rate so that a cleanup slowing them shows up as latency, not as fewer
// transactions.

// accountsDDL is the business table: one row per account, updated in
// place, as a balance is.
const accountsDDL = `CREATE TABLE accounts (
  id            integer PRIMARY KEY,
  balance_cents bigint NOT NULL DEFAULT 0,
  updated_at    timestamptz NOT NULL DEFAULT now()
)`

// accountsFillSQL creates accounts 1 to $1.
const accountsFillSQL = `INSERT INTO accounts (id) SELECT g FROM generate_series(1, $1) g`

// creditAccountSQL is the business write, by primary key.
const creditAccountSQL = `UPDATE accounts SET balance_cents = balance_cents + $2, updated_at = now() WHERE id = $1`

// retentionAccounts is how many account rows the writers spread over:
// enough that two writers never wait for one row's lock.
const retentionAccounts = 1000

// accountCredited is the event each business transaction emits.
type accountCredited struct {
	AccountID   int   `json:"account_id"`
	AmountCents int64 `json:"amount_cents"`
}

// bizSample is one business transaction: when its slot of the schedule
// began, and from then until its COMMIT returned.
type bizSample struct {
	at  time.Time
	lat time.Duration
}

// bizLoad is the writers, running until stop.
type bizLoad struct {
	start  time.Time
	period time.Duration
	next   atomic.Int64
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	mu      sync.Mutex
	samples []bizSample
	err     error
}

// startBizLoad starts writers goroutines that together run rate business
// transactions a second on pool, emitting through p. A transaction's
// latency runs from the start of its slot in the schedule, not from
// when a writer got to it: a writer held up delays the next slots, and
// their wait counts (no coordinated omission).
func startBizLoad(ctx context.Context, pool *pgxpool.Pool, p *outbox.Producer, writers, rate int) *bizLoad {
	l := &bizLoad{start: time.Now(), period: time.Second / time.Duration(rate), done: make(chan struct{})}
	accounts := make([]uuid.UUID, retentionAccounts)
	for i := range accounts {
		accounts[i] = uuid.NewMD5(uuid.Nil, fmt.Appendf(nil, "account-%d", i+1))
	}
	for range writers {
		l.wg.Go(func() {
			for {
				i := l.next.Add(1) - 1
				at := l.start.Add(time.Duration(i) * l.period)
				if !l.waitUntil(at) {
					return
				}
				id := int(i%retentionAccounts) + 1
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, creditAccountSQL, id, 100); err != nil {
						return err
					}
					_, err := p.Emit(ctx, tx, outbox.Event{AggregateID: accounts[id-1], Type: "account.credited", Payload: accountCredited{AccountID: id, AmountCents: 100}})
					return err
				})
				l.mu.Lock()
				if err != nil {
					l.err = fmt.Errorf("business transaction: %w", err)
					l.mu.Unlock()
					return
				}
				l.samples = append(l.samples, bizSample{at: at, lat: time.Since(at)})
				l.mu.Unlock()
			}
		})
	}
	return l
}

// waitUntil sleeps until t; false when the load was stopped meanwhile.
func (l *bizLoad) waitUntil(t time.Time) bool {
	select {
	case <-l.done:
		return false
	default:
	}
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-l.done:
		return false
	case <-timer.C:
		return true
	}
}

// stop ends the load once the transactions in flight commit, and returns
// the first error a writer met. It can be called again.
func (l *bizLoad) stop() error {
	l.once.Do(func() { close(l.done) })
	l.wg.Wait()
	return l.failed()
}

func (l *bizLoad) failed() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// committed is how many transactions committed.
func (l *bizLoad) committed() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(len(l.samples))
}

// between returns the sorted latencies of the transactions whose slot
// began in [from, to).
func (l *bizLoad) between(from, to time.Time) []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Duration
	for _, s := range l.samples {
		if !s.at.Before(from) && s.at.Before(to) {
			out = append(out, s.lat)
		}
	}
	slices.Sort(out)
	return out
}

// awaitSince waits until n transactions whose slot began at or after from
// have committed, and returns the end of the last one's slot, so that
// between(from, end) holds them.
func (l *bizLoad) awaitSince(ctx context.Context, from time.Time, n int) (time.Time, error) {
	for {
		if err := l.failed(); err != nil {
			return time.Time{}, err
		}
		l.mu.Lock()
		var got []time.Time
		for _, s := range l.samples {
			if !s.at.Before(from) {
				got = append(got, s.at)
			}
		}
		l.mu.Unlock()
		if len(got) >= n {
			slices.SortFunc(got, func(a, b time.Time) int { return a.Compare(b) })
			return got[n-1].Add(time.Nanosecond), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
