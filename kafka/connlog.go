package kafka

import (
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// connLogEvery is how often a broker that stays unreachable is logged
// again.
const connLogEvery = time.Minute

// connLog is a franz-go hook that logs failed broker connections: the
// first failure at once, then at most one line per broker every
// connLogEvery, and a line when the broker is reached again. The errors
// are dial, TLS and SASL errors: they name the address, never a secret.
type connLog struct {
	log *slog.Logger

	mu   sync.Mutex
	down map[string]*brokerDown // by host:port
}

// brokerDown is a broker that could not be reached.
type brokerDown struct {
	since, logged time.Time
	failures      int
}

func newConnLog(log *slog.Logger) *connLog {
	return &connLog{log: log, down: map[string]*brokerDown{}}
}

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (h *connLog) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	addr := net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))
	now := time.Now()
	h.mu.Lock()
	d := h.down[addr]
	if err == nil {
		delete(h.down, addr)
		h.mu.Unlock()
		if d != nil {
			h.log.Info("Kafka broker reachable again", "broker", addr, "down_for", now.Sub(d.since).Round(time.Millisecond))
		}
		return
	}
	if d == nil {
		d = &brokerDown{since: now}
		h.down[addr] = d
	}
	d.failures++
	if !d.logged.IsZero() && now.Sub(d.logged) < connLogEvery {
		h.mu.Unlock()
		return
	}
	failures, since := d.failures, d.since
	d.logged = now
	h.mu.Unlock()
	h.log.Warn("cannot connect to Kafka broker; retrying", "broker", addr, "err", err,
		"down_for", now.Sub(since).Round(time.Millisecond), "failed_attempts", failures)
}
