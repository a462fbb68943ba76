package natspub

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox/relay"
)

// Codes ErrorCode gives publish errors.
const (
	codeNoStream     = "no_stream"
	codeTooLarge     = "too_large"
	codeReserved     = "reserved_header"
	codeNotSent      = "not_sent"
	codeTimeout      = "timeout"
	codeCanceled     = "canceled"
	codeDisconnected = "disconnected"
	codeNoResponders = "no_responders"
	codeStreamFull   = "stream_full"
	codeAPI          = "jetstream_api"
	codeOther        = "other"
)

// ErrorCode names a publish error for metrics: no_stream, too_large,
// reserved_header, not_sent (behind a failed message of its aggregate),
// timeout, canceled, disconnected, no_responders, stream_full (a stream
// with discard-new at its limits), jetstream_api (any other error the
// JetStream API answered) or other.
func (p *Publisher) ErrorCode(err error) string {
	var apiErr *jetstream.APIError
	switch {
	case relay.ReasonOf(err) == relay.ReasonInvalidTopic:
		return codeNoStream
	case relay.ReasonOf(err) == relay.ReasonTooLarge:
		return codeTooLarge
	case relay.ReasonOf(err) == relay.ReasonReservedHeader:
		return codeReserved
	case errors.Is(err, errNotSent):
		return codeNotSent
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, nats.ErrTimeout):
		return codeTimeout
	case errors.Is(err, context.Canceled):
		return codeCanceled
	case errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionReconnecting):
		return codeDisconnected
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return codeNoResponders
	case errors.As(err, &apiErr) && streamFull(apiErr):
		return codeStreamFull
	case errors.As(err, &apiErr):
		return codeAPI
	}
	return codeOther
}

// streamFull reports the refusals of a stream with discard-new policy at
// one of its limits (messages, bytes, messages per subject): a retry goes
// through once the stream has room again.
func streamFull(e *jetstream.APIError) bool {
	return e.ErrorCode == 10077 || e.ErrorCode == 10078 || e.ErrorCode == 10047
}
