// Package webhookconsumer receives the events the webhook sink
// (relay/webhookpub) delivers, with exactly-once effects: Handler is an
// http.Handler that verifies each request's Standard Webhooks signature
// and processes the event on a consumer.Dispatcher (dedupe in the
// processed table in the handler's transaction, retries), answering 2xx
// only after the commit. An event that can never be processed is answered
// 422, and the relay holds its row: the outbox's own dead letter, which
// 'outbox events retry' sends again; or HandlerConfig.DeadLetter keeps it
// elsewhere and the aggregate moves on.
//
//	d, err := consumer.NewDispatcher(consumer.DispatcherConfig{Name: "loyalty", Pool: pool, System: "webhook",
//		Handlers: map[string]consumer.Handler{"order.placed": creditPoints}})
//	secrets, err := webhookconsumer.ParseSecrets(os.Getenv("OUTBOX_WEBHOOK_SECRET"))
//	v, err := webhookconsumer.NewVerifier(webhookconsumer.VerifierConfig{Secrets: secrets})
//	h, err := webhookconsumer.NewHandler(webhookconsumer.HandlerConfig{Dispatcher: d, Verifier: v})
//	http.Handle("/outbox", h)
//
// Verifier and ReadEvent serve a receiver of its own.
package webhookconsumer
