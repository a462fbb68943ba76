package amqppub

import (
	"context"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
)

// Every error Publish returns has a short code from a bounded set.
func TestErrorCode(t *testing.T) {
	t.Parallel()
	p := &Publisher{}
	for err, want := range map[error]string{
		errNotSent:                     "not_sent",
		fmt.Errorf("x: %w", errNacked): "nack",
		relay.PermanentReason(relay.ReasonInvalidTopic, fmt.Errorf("%w: k", errNoRoute)): "no_route",
		&closedError{id: 1, err: &amqp.Error{Code: amqp.ConnectionForced}}:               "connection_forced",
		&closedError{id: 1}:               "channel_closed",
		fmt.Errorf("%w x: boom", errDial): "unreachable",
		context.DeadlineExceeded:          "timeout",
		relay.PermanentReason(relay.ReasonNotAuthorized, fmt.Errorf("refused")): "not_authorized",
		fmt.Errorf("something else"): "other",
	} {
		require.Equal(t, want, p.ErrorCode(err), err.Error())
	}
}

// The server's words for a refused body and a refused routing key name
// the culprit.
func TestServerRefusalsParsed(t *testing.T) {
	t.Parallel()
	size, limit := oversized(&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 60011 is larger than configured max size 50000"})
	require.Equal(t, [2]int{60011, 50000}, [2]int{size, limit})
	size, _ = oversized(&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - inequivalent arg 'type'"})
	require.Zero(t, size)
	require.Equal(t, "secret.x", refusedTopic(&amqp.Error{Code: amqp.AccessRefused,
		Reason: "ACCESS_REFUSED - access to topic 'secret.x' in exchange 'ex' in vhost '/' refused for user 'guest'"}))
	require.Empty(t, refusedTopic(&amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED - access to exchange 'ex' refused"}))
}
