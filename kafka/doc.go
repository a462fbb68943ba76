// Package kafka says how outbox reaches a Kafka cluster with franz-go: the
// client configuration (brokers, TLS, SASL) shared by the relayer's
// publisher (package relay/kafkapub) and the consumer (package consumer),
// and the producer options both use.
//
// It imports no other outbox package, so a service that only consumes
// links neither the relayer nor the migrator. The embedded dev broker is in
// package devkafka.
//
//	opts, err := kafka.ClientConfig{Brokers: []string{"localhost:9092"}}.Options()
//	client, err := kgo.NewClient(opts...)
package kafka
