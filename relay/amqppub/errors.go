package amqppub

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox/relay"
)

var (
	// errNotSent marks a message left unsent because an earlier message
	// of its aggregate failed, or the channel closed first.
	errNotSent = errors.New("amqppub: not sent: an earlier message of its aggregate failed, or the channel closed")
	// errNacked is a broker's negative confirm: it carries no reason,
	// and a later attempt may succeed.
	errNacked    = errors.New("amqppub: the server nacked the message")
	errNoRoute   = errors.New("amqppub: no route")
	errTooLarge  = errors.New("amqppub: message too large")
	errBadKey    = errors.New("amqppub: invalid routing key")
	errReserved  = errors.New("amqppub: reserved header")
	errBadHeader = errors.New("amqppub: invalid header")
	errDial      = errors.New("amqppub: cannot connect to")
)

// closedError is a message in flight when its channel or connection
// closed: it may or may not have reached the server, and a retry on a new
// channel decides.
type closedError struct {
	id  int64
	err *amqp.Error
}

func (e *closedError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("amqppub: the channel closed before the server confirmed message %d", e.id)
	}
	return fmt.Sprintf("amqppub: the channel closed before the server confirmed message %d: %v", e.id, e.err)
}

func (e *closedError) Unwrap() error {
	if e.err == nil { // a clean close says no more
		return nil
	}
	return e.err
}

// noRoute is the error of a message the server returned: with the
// mandatory flag, a message no queue is bound for comes back instead of
// being dropped. The reason is relay.ReasonInvalidTopic: the type routes
// to no existing destination, as a missing Kafka topic does.
func noRoute(m *relay.Message, exchange string, r amqp.Return) error {
	return relay.PermanentReason(relay.ReasonInvalidTopic, fmt.Errorf(
		"%w: no queue is bound for routing key %q on exchange %q (the server returned message %d: %d %s); bind a queue for it, then retry the row ('outbox events retry'), or park it",
		errNoRoute, m.Topic, exchange, m.ID, r.ReplyCode, r.ReplyText))
}

// oversizedText is how RabbitMQ (3.8 and later) words the refusal of a
// body over max_message_size, when it closes the channel.
var oversizedText = regexp.MustCompile(`message size (\d+) is larger than configured max size (\d+)`)

// oversized reads the body size and the server's limit from a channel
// closed for a message over max_message_size; zeros for another close.
func oversized(e *amqp.Error) (size, limit int) {
	if e == nil || e.Code != amqp.PreconditionFailed {
		return 0, 0
	}
	m := oversizedText.FindStringSubmatch(e.Reason)
	if m == nil {
		return 0, 0
	}
	size, _ = strconv.Atoi(m[1])
	limit, _ = strconv.Atoi(m[2])
	return size, limit
}

// refusedText is how RabbitMQ words a publish that topic authorisation
// refuses, when it closes the channel.
var refusedText = regexp.MustCompile(`access to topic '(.*)' in exchange '`)

// refusedTopic reads the refused routing key from a channel closed by
// topic authorisation; "" for another close.
func refusedTopic(e *amqp.Error) string {
	if e == nil || e.Code != amqp.AccessRefused {
		return ""
	}
	if m := refusedText.FindStringSubmatch(e.Reason); m != nil {
		return m[1]
	}
	return ""
}

// Codes ErrorCode returns.
const (
	codeNoRoute     = "no_route"
	codeNacked      = "nack"
	codeTooLarge    = "too_large"
	codeBadKey      = "invalid_routing_key"
	codeReserved    = "reserved_header"
	codeBadHeader   = "invalid_header"
	codeNotSent     = "not_sent"
	codeClosed      = "channel_closed"
	codeTimeout     = "timeout"
	codeCanceled    = "canceled"
	codeUnreachable = "unreachable"
	codeOther       = "other"
)

// amqpCodes names the AMQP reply codes a server closes a channel or a
// connection with.
var amqpCodes = map[int]string{
	amqp.ContentTooLarge: "content_too_large", amqp.NoRoute: codeNoRoute, amqp.NoConsumers: "no_consumers",
	amqp.ConnectionForced: "connection_forced", amqp.InvalidPath: "invalid_path", amqp.AccessRefused: "access_refused",
	amqp.NotFound: "not_found", amqp.ResourceLocked: "resource_locked", amqp.PreconditionFailed: "precondition_failed",
	amqp.FrameError: "frame_error", amqp.SyntaxError: "syntax_error", amqp.CommandInvalid: "command_invalid",
	amqp.ChannelError: "channel_error", amqp.UnexpectedFrame: "unexpected_frame", amqp.ResourceError: "resource_error",
	amqp.NotAllowed: "not_allowed", amqp.NotImplemented: "not_implemented", amqp.InternalError: "internal_error",
}

// ErrorCode names a publish error for metrics: no_route, nack,
// too_large, invalid_routing_key, reserved_header, invalid_header,
// not_sent, timeout, canceled, unreachable, the AMQP reply code's name
// when the server closed the channel with one (access_refused, ...),
// channel_closed, the relay.Reason of another permanent error, or other.
func (p *Publisher) ErrorCode(err error) string {
	sentinels := []struct {
		err  error
		code string
	}{
		{errNoRoute, codeNoRoute}, {errNacked, codeNacked}, {errTooLarge, codeTooLarge}, {errBadKey, codeBadKey},
		{errReserved, codeReserved}, {errBadHeader, codeBadHeader}, {errNotSent, codeNotSent},
		{context.DeadlineExceeded, codeTimeout}, {context.Canceled, codeCanceled},
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.code
		}
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		if name, ok := amqpCodes[ae.Code]; ok {
			return name
		}
	}
	var ce *closedError
	switch {
	case errors.As(err, &ce), errors.Is(err, amqp.ErrClosed):
		return codeClosed
	case errors.Is(err, errDial):
		return codeUnreachable
	case relay.ReasonOf(err) != "":
		return relay.ReasonOf(err)
	}
	return codeOther
}
