package webhookpub_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/webhookpub"
)

// A binary payload is the request's body byte for byte, with its content
// type as the Content-Type header; a JSON one keeps application/json.
func TestBinaryPayloadsCarryTheirContentType(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	got := map[string][2]string{}
	p := publisher(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got[r.Header.Get("webhook-id")] = [2]string{r.Header.Get("Content-Type"), string(body)}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}), webhookpub.Config{})
	data := []byte{0x0a, 0, 0xff, 0xfe, 0}
	errs := p.Publish(context.Background(), []relay.Message{
		{ID: 1, AggregateID: uuid.New(), Type: "order.placed", Topic: "order", Payload: data, ContentType: "application/x-protobuf"},
		{ID: 2, AggregateID: uuid.New(), Type: "order.placed", Topic: "order", Payload: []byte(`{"a" : 1}`)},
	})
	for i, err := range errs {
		require.NoError(t, err, i)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 2)
	binary := 0
	for _, g := range got {
		if g[0] == "application/x-protobuf" {
			binary++
			require.Equal(t, string(data), g[1])
		} else {
			require.Equal(t, "application/json", g[0])
			require.Equal(t, `{"a" : 1}`, g[1])
		}
	}
	require.Equal(t, 1, binary)
}
