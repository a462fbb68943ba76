package relay_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
)

// A transient failure marks the sink failing until a publish goes
// through; a message's own refusal, a message not sent behind a failed
// one, a publish of nothing and one cut short by its caller change nothing.
func TestPublishHealth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	notSent := errors.New("not sent")
	var h relay.PublishHealth
	require.NoError(t, h.Err(), "the zero value is ready")

	h.Note(ctx, []error{nil, relay.PermanentReason(relay.ReasonTooLarge, errors.New("too big"))})
	require.NoError(t, h.Err(), "a message's own refusal is not a failing sink")

	down := errors.New("connection refused")
	h.Note(ctx, []error{nil, down, notSent}, notSent)
	require.ErrorIs(t, h.Err(), down)
	require.ErrorContains(t, h.Err(), "publishing has failed since ")

	h.Note(ctx, nil)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	h.Note(cancelled, []error{nil})
	h.Note(ctx, []error{fmtWrap(notSent)}, notSent)
	require.ErrorIs(t, h.Err(), down, "nothing above says the sink works again")

	again := errors.New("timeout")
	h.Note(ctx, []error{again})
	require.ErrorIs(t, h.Err(), again, "the latest failure is reported")

	h.Note(ctx, []error{nil, nil})
	require.NoError(t, h.Err(), "a publish that went through clears it")
}

func fmtWrap(err error) error { return errors.Join(errors.New("message 7"), err) }
