// Package amqppub is the relayer's RabbitMQ sink: it publishes outbox
// events to a durable topic exchange over AMQP 0-9-1, with publisher
// confirms, persistent messages and the mandatory flag, so that an event
// no queue is bound for comes back and is held instead of vanishing.
//
//	pub, err := amqppub.New(amqppub.Config{URL: "amqp://guest:guest@127.0.0.1:5672/"})
//	if err != nil { ... }
//	defer pub.Close()
//	relay.New(relay.Config{Common: relay.Common{Pool: pool, Sink: pub}})
//
// Producers route alike with routing.AMQP.
package amqppub
