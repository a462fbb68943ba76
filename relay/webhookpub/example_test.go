package webhookpub_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/webhookpub"
)

// A Publisher sends each event as one signed POST; the relayer calls
// Publish (relay.Config.Common.Sink), as here by hand.
func Example() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println(r.Method, r.URL.Path, r.Header.Get("webhook-id"), r.Header.Get("outbox-event-type"), r.Header.Get("traceparent") != "")
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()

	secrets, err := webhookpub.ParseSecrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") // from the environment, in real life
	if err != nil {
		panic(err)
	}
	sink, err := webhookpub.New(webhookpub.Config{Endpoint: srv.URL + "/outbox", Secrets: secrets, Source: "shop"})
	if err != nil {
		panic(err)
	}
	errs := sink.Publish(context.Background(), []relay.Message{{ID: 42, AggregateID: uuid.New(), Type: "order.placed", Topic: "order",
		Payload: []byte(`{"total": 10}`), Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}})
	fmt.Println(errs[0])
	// Output:
	// POST /outbox shop:42 order.placed true
	// <nil>
}
