// Package webhookpub is the relayer's Standard Webhooks sink: each event
// is one signed POST to its endpoint, the payload byte for byte as the
// body (https://www.standardwebhooks.com).
//
// A request carries webhook-id (the event id, qualified by the relayer's
// source: "billing:42"), webhook-timestamp, webhook-signature (one
// "v1,<base64 HMAC-SHA256 of id.timestamp.body>" per secret, so that a
// rotation keeps both old and new receivers working), content-type,
// outbox-event-id, outbox-event-type, outbox-aggregate-id, outbox-topic,
// outbox-event-source (with a source) and the event's own headers,
// percent-encoded where HTTP cannot carry them as they are (see
// docs/sinks/webhook.md).
//
// The guarantees are the other sinks': an aggregate's events go one
// request at a time, in order, and nothing of an aggregate is sent after
// a failed one of it; different aggregates go at once, up to
// Config.Concurrency requests per endpoint. 408, 429, 5xx and requests
// without an answer are retried with backoff and jitter (honouring
// Retry-After) within Config.DeliveryTimeout, then handed back to the
// relayer as retriable; 413 holds the event as relay.ReasonTooLarge, 401
// and 403 as relay.ReasonNotAuthorized, any other 3xx or 4xx as
// relay.ReasonBrokerRefused with the status in its message.
//
//	secrets, err := webhookpub.ParseSecrets(os.Getenv("OUTBOX_WEBHOOK_SECRET"))
//	sink, err := webhookpub.New(webhookpub.Config{Endpoint: "https://hooks.example.com/outbox", Secrets: secrets})
//	r, err := relay.New(relay.Config{Common: relay.Common{Pool: pool, Sink: sink}})
package webhookpub
