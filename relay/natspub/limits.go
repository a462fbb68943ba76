package natspub

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox/routing"
)

// Limit sources, as error messages name them.
const (
	limitFromOverride = "Config.MaxPayloadBytes"
	limitFromServer   = "the server's max_payload"
	limitFromStream   = "the stream's max_msg_size"
	limitFromDefault  = "nats-server's default max_payload; the connection reported none"
)

// How long a learnt limit is trusted before it is read again, and how soon
// a failed read is tried again.
const (
	limitTTL      = time.Minute
	limitRetryTTL = 5 * time.Second
	lookupTimeout = 5 * time.Second
)

// subjectLimit is what the publisher knows of a subject before sending to
// it: whether a stream captures it, and the largest message it accepts.
type subjectLimit struct {
	noStream bool
	bytes    int
	from     string
	at       time.Time
	ttl      time.Duration
}

// limits learns, per subject, the stream that captures it and that
// stream's max_msg_size, against the server's max_payload, and caches it.
type limits struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	override int

	mu        sync.Mutex
	bySubject map[string]subjectLimit
}

func newLimits(nc *nats.Conn, js jetstream.JetStream, override int) *limits {
	return &limits{nc: nc, js: js, override: override, bySubject: map[string]subjectLimit{}}
}

// lookup returns the limit of each of subjects, asking the server about
// those not known, or known for too long.
func (l *limits) lookup(ctx context.Context, subjects []string) map[string]subjectLimit {
	out := make(map[string]subjectLimit, len(subjects))
	if l.override > 0 {
		for _, s := range subjects {
			out[s] = subjectLimit{bytes: l.override, from: limitFromOverride}
		}
		return out
	}
	now := time.Now()
	var stale []string
	l.mu.Lock()
	for _, s := range subjects {
		if lim, ok := l.bySubject[s]; ok && now.Sub(lim.at) < lim.ttl {
			out[s] = lim
		} else {
			stale = append(stale, s)
		}
	}
	l.mu.Unlock()
	for _, s := range stale {
		lim := l.read(ctx, s)
		out[s] = lim
		if !lim.noStream {
			l.mu.Lock()
			l.bySubject[s] = lim
			l.mu.Unlock()
		}
	}
	return out
}

// read asks the server which stream captures subject and its
// max_msg_size. When the server cannot say (JetStream not up, a timeout),
// the server's max_payload applies, read again soon; the publish then
// finds out. A missing stream is not cached: once an operator adds it,
// the rows retried go through at once.
func (l *limits) read(ctx context.Context, subject string) subjectLimit {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	lim := l.serverLimit()
	lim.at, lim.ttl = time.Now(), limitRetryTTL
	name, err := l.js.StreamNameBySubject(ctx, subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		lim.noStream = true
		return lim
	}
	if err != nil {
		return lim
	}
	s, err := l.js.Stream(ctx, name)
	if err != nil {
		return lim
	}
	lim.ttl = limitTTL
	if n := int(s.CachedInfo().Config.MaxMsgSize); n > 0 && n < lim.bytes {
		lim.bytes, lim.from = n, limitFromStream
	}
	return lim
}

func (l *limits) serverLimit() subjectLimit {
	if n := l.nc.MaxPayload(); n > 0 {
		return subjectLimit{bytes: int(n), from: limitFromServer}
	}
	return subjectLimit{bytes: routing.DefaultNATSMaxPayloadBytes, from: limitFromDefault}
}

// streamMissing reports whether the server says that no stream captures
// subject.
func (l *limits) streamMissing(ctx context.Context, subject string) bool {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	_, err := l.js.StreamNameBySubject(ctx, subject)
	return errors.Is(err, jetstream.ErrStreamNotFound)
}

// forget drops what l learnt of subject, so that the next lookup reads it
// again (its stream may have changed).
func (l *limits) forget(subject string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.bySubject, subject)
}
