package outbox_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
)

// The Kafka routing says an empty type is empty, not that it starts with '.'; a type
// that does start with '.' is still told so.
func TestTopicOfAnEmptyTypeSaysItIsEmpty(t *testing.T) {
	t.Parallel()
	_, err := outbox.KafkaRouting{}.Destination("")
	require.True(t, errors.Is(err, outbox.ErrInvalidTopic), err)
	require.ErrorContains(t, err, "the type is empty")
	require.NotContains(t, err.Error(), "starts with")

	_, err = outbox.KafkaRouting{TopicPrefix: "prod."}.Destination(".placed")
	require.ErrorContains(t, err, `type ".placed" starts with '.'`)
}
