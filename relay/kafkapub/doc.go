// Package kafkapub is the relayer's Kafka publisher: a relay.Sink on a
// franz-go client that turns outbox rows into Kafka records (the headers of
// the wire contract, the aggregate id as key), sizes produce requests per
// topic by the limits it learns from the broker, classifies the failures
// retrying cannot fix as permanent, follows a topic recreated under it (a
// new topic id), and reports in Ready whether it can publish, for a
// readiness check.
//
//	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{"localhost:9092"}})
//	pub := kafkapub.NewPublisher(client, kafkapub.PublisherConfig{Source: "shop"})
//	r, err := relay.New(relay.Config{Common: relay.Common{Pool: pool, Sink: pub}})
package kafkapub
