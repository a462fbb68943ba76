package walrelay

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// lingerBelow is the size under which a read that drained the socket is
// followed by a wait: a few steady transactions' worth.
const lingerBelow = 4096

// lingerConn is the replication connection's socket, read so that one
// read takes in many transactions while the stream is busy.
//
// The walsender writes each message of the stream (BEGIN, each change,
// COMMIT) on its own. A reader that keeps up takes each in with a read of
// its own, and pays for each a wake-up, a read and a round of the stream
// loop. On a busy outbox that costs the relayer more CPU than publishing
// does (BenchmarkStreamBesidePgbench shows the cost per event with and
// without the linger).
//
// So, once a read has taken in everything the server had sent (it came
// back short of the buffer), the next read waits until linger has passed
// since it, letting the socket fill. A read that filled the buffer is
// followed at once, and so is every read while the stream is behind (the
// transaction being read committed more than behindAge ago, the
// walsender's decoding the bottleneck). The first message after a quiet
// spell is read as it comes: an idle or lightly used outbox pays
// nothing, and a busy one about linger per event at most.
//
// A read that brought lingerBelow bytes or more is followed at once too:
// the stream is busy enough that reads take in many messages anyway, and
// a message larger than the socket's buffers is read without a wait per
// buffer-full.
//
// A read deadline bounds the wait too, and one set while it waits (the
// stream's round ending, a settled batch waking the stream, the context's
// end) is honoured at once.
type lingerConn struct {
	net.Conn
	linger time.Duration
	clock  clock
	timer  timer // of Read's wait; reads are sequential (pgconn's reader)
	// behind is set while the stream reads transactions that committed
	// long ago (a backlog): reads do not wait then.
	behind atomic.Bool

	// Deadlines are set from other goroutines.
	mu       sync.Mutex
	kick     chan struct{}
	drained  time.Time // when the last short read returned; zero after a full one
	deadline time.Time // the read deadline
}

func newLingerConn(c net.Conn, linger time.Duration) *lingerConn {
	return &lingerConn{Conn: c, linger: linger, clock: wallClock{}, kick: make(chan struct{}, 1)}
}

// wait is how long Read waits before it reads.
func (c *lingerConn) wait() time.Duration {
	if c.behind.Load() {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.drained.IsZero() {
		return 0
	}
	now := c.clock.Now()
	w := c.linger - now.Sub(c.drained)
	if !c.deadline.IsZero() {
		w = min(w, c.deadline.Sub(now))
	}
	return w
}

func (c *lingerConn) Read(p []byte) (int, error) {
	for w := c.wait(); w > 0; w = c.wait() {
		if c.timer == nil {
			c.timer = c.clock.NewTimer(w)
		} else {
			c.timer.Reset(w)
		}
		select {
		case <-c.timer.C():
		case <-c.kick: // a new deadline: look again
			c.timer.Stop()
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		if n < len(p) && n < lingerBelow {
			c.drained = c.clock.Now()
		} else {
			c.drained = time.Time{}
		}
		c.mu.Unlock()
	}
	return n, err
}

func (c *lingerConn) setReadDeadline(t time.Time) {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *lingerConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	c.setReadDeadline(t)
	return err
}

func (c *lingerConn) SetReadDeadline(t time.Time) error {
	err := c.Conn.SetReadDeadline(t)
	c.setReadDeadline(t)
	return err
}

// clock is the time the relayer's own waits are measured in: the wall
// clock, or a test's, which the test moves on.
type clock interface {
	Now() time.Time
	NewTimer(d time.Duration) timer
}

// timer is a clock's time.Timer.
type timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) NewTimer(d time.Duration) timer { return wallTimer{time.NewTimer(d)} }

type wallTimer struct{ *time.Timer }

func (t wallTimer) C() <-chan time.Time { return t.Timer.C }
