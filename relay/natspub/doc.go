// Package natspub is the relayer's NATS JetStream sink: a relay.Sink that
// publishes each event to the subject its type routes to
// (routing.NATS: the topic prefix followed by the type), waits for the
// stream's acknowledgement, and sets Nats-Msg-Id to the event's
// source-qualified id so that the stream drops a copy sent again within its
// duplicate window.
//
//	nc, err := nats.Connect("nats://127.0.0.1:4222")
//	...
//	pub, err := natspub.New(nc, natspub.Config{Source: "shop"})
//	...
//	relayer, err := relay.New(relay.Config{Common: relay.Common{Pool: pool, Sink: pub}})
//
// Producers route alike: outbox.Config{Routing: routing.NATS{}}. A stream
// must capture the subjects (nats stream add outbox --subjects 'order.>');
// an event whose subject no stream captures is held with reason
// invalid_topic, not lost. docs/sinks/nats.md has the guarantees, limits and
// settings.
package natspub
