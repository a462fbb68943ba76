package kafkapub

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/kafkatopic"
	"github.com/pgoutbox/outbox/relay"
)

// A Publisher is the relayer's Kafka sink, and tells /readyz whether it can
// publish.
var (
	_ relay.Sink    = (*Publisher)(nil)
	_ relay.Readier = (*Publisher)(nil)
)

// Routing is Kafka's routing for topicPrefix: outbox.KafkaRouting, the
// producers' default, so a type Emit accepts is a type the relayer can
// publish. It refuses a prefix that cannot start a topic name.
func (p *Publisher) Routing(topicPrefix string) (outbox.Routing, error) {
	if err := kafkatopic.Validate(topicPrefix + "x"); topicPrefix != "" && err != nil {
		return nil, fmt.Errorf("topic prefix %q cannot start a topic name: %s", topicPrefix, err)
	}
	return outbox.KafkaRouting{TopicPrefix: topicPrefix, CloudEvents: p.ce != nil}, nil
}

// Codes ErrorCode gives errors that carry no Kafka error name.
const (
	codeTimeout      = "timeout"
	codeRetries      = "retries_exhausted"
	codeCanceled     = "canceled"
	codeClientClosed = "client_closed"
	codeBufferFull   = "buffer_full"
	codeOther        = "other"
)

// ErrorCode names a publish error for metrics: the Kafka protocol error
// name when the broker sent one (MESSAGE_TOO_LARGE, ...), else a
// client-side cause (timeout, retries_exhausted, canceled, client_closed,
// buffer_full, other).
func (p *Publisher) ErrorCode(err error) string {
	var ke *kerr.Error
	switch {
	case errors.As(err, &ke):
		return ke.Message
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, context.DeadlineExceeded):
		return codeTimeout
	case errors.Is(err, kgo.ErrRecordRetries):
		return codeRetries
	case errors.Is(err, context.Canceled), errors.Is(err, kgo.ErrAborting):
		return codeCanceled
	case errors.Is(err, kgo.ErrClientClosed):
		return codeClientClosed
	case errors.Is(err, kgo.ErrMaxBuffered):
		return codeBufferFull
	}
	return codeOther
}
