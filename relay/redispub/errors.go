package redispub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/outbox/relay"
)

// errNotSent marks a message left unsent because an earlier message of its
// aggregate failed in the same batch.
var errNotSent = errors.New("not sent: an earlier message of its aggregate failed")

// Codes ErrorCode gives errors that carry no Redis error name.
const (
	codeNotSent       = "not_sent"
	codeNotReplicated = "not_replicated"
	codeTimeout       = "timeout"
	codeCanceled      = "canceled"
	codeConnection    = "connection"
	codeClosed        = "client_closed"
	codeOther         = "other"
)

// serverCodes are the Redis error names ErrorCode passes through; any
// other Redis error is "redis_error", so the label's values stay bounded.
var serverCodes = map[string]bool{
	"ERR": true, "WRONGTYPE": true, "OOM": true, "NOPERM": true, "NOAUTH": true, "WRONGPASS": true,
	"NOSCRIPT": true, "LOADING": true, "READONLY": true, "MASTERDOWN": true, "NOREPLICAS": true,
	"BUSY": true, "MOVED": true, "ASK": true, "TRYAGAIN": true, "CLUSTERDOWN": true, "EXECABORT": true,
}

// serverError is an error reply of Redis (or the WAIT shortfall), with
// its error name.
type serverError struct {
	code string
	msg  string
}

func (e *serverError) Error() string { return "redis: " + e.msg }

// codeOf returns the error name a Redis error reply starts with.
func codeOf(msg string) string {
	code, _, _ := strings.Cut(msg, " ")
	if serverCodes[code] {
		return code
	}
	return "redis_error"
}

// entryError classifies the refusal of one XADD inside the publish script.
// WRONGTYPE (the key holds no stream) is permanent for the destination,
// NOPERM (the user may not write the key) too; OOM (maxmemory reached) and
// the server's passing states (LOADING, READONLY after a failover,
// MASTERDOWN, BUSY, NOREPLICAS) are retriable. A plain ERR is Redis
// refusing that entry's command itself: permanent.
func entryError(msg, stream string) error {
	e := &serverError{code: codeOf(msg), msg: msg}
	switch e.code {
	case "WRONGTYPE":
		return relay.PermanentReason(relay.ReasonInvalidTopic, fmt.Errorf(
			"%w: key %q exists and is not a stream; delete or rename that key (or route the type to another stream), then retry the row ('outbox events retry')", e, stream))
	case "NOPERM":
		return relay.PermanentReason(relay.ReasonNotAuthorized, fmt.Errorf(
			"%w: the relay's Redis user may not add to stream %q; grant it XADD on that key (ACL SETUSER ... ~%s +xadd), then retry the row", e, stream, stream))
	case "ERR":
		return relay.PermanentReason(relay.ReasonBrokerRefused, fmt.Errorf("%w: Redis refused the entry for stream %q", e, stream))
	case "OOM":
		return fmt.Errorf("%w: Redis is at its maxmemory; free memory (trim streams, ?maxlen) or raise maxmemory", e)
	}
	return e
}

// commandError classifies the failure of a whole script call: the
// connection, a timeout, or a Redis error reply for the call itself
// (NOPERM when the user may not run scripts: permanent; others retriable).
func commandError(err error) error {
	var re redis.Error
	if errors.As(err, &re) {
		e := &serverError{code: codeOf(re.Error()), msg: re.Error()}
		if e.code == "NOPERM" || e.code == "NOAUTH" || e.code == "WRONGPASS" {
			return relay.PermanentReason(relay.ReasonNotAuthorized, fmt.Errorf(
				"%w: the relay's Redis user may not publish; grant it EVALSHA, SCRIPT LOAD and XADD (and WAIT with ?wait), then retry the row", e))
		}
		return e
	}
	return retriable("publishing", err)
}

// retriable wraps a failure a retry may fix with what was being done.
func retriable(doing string, err error) error {
	return fmt.Errorf("redis: %s: %w", doing, err)
}

// ErrorCode names a publish error for metrics: the Redis error name when
// Redis sent one (WRONGTYPE, OOM, NOPERM, ERR, ...; "redis_error" for a
// name outside that set), else not_sent, not_replicated, timeout,
// canceled, connection, client_closed or other; too_large and
// reserved_header for the rows refused before sending.
func (p *Publisher) ErrorCode(err error) string {
	var se *serverError
	var ne net.Error
	switch {
	case errors.As(err, &se):
		return se.code
	case errors.Is(err, errNotSent):
		return codeNotSent
	case relay.ReasonOf(err) != "":
		return relay.ReasonOf(err)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return codeTimeout
	case errors.Is(err, context.Canceled):
		return codeCanceled
	case errors.Is(err, redis.ErrClosed):
		return codeClosed
	case errors.As(err, &ne), errors.Is(err, net.ErrClosed), errors.Is(err, errEOF):
		return codeConnection
	}
	return codeOther
}

// errEOF is how a connection the server closed surfaces.
var errEOF = io.EOF
