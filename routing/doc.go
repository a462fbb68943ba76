// Package routing holds the outbox.Routing of every sink besides Kafka's
// (outbox.KafkaRouting, the default): where an event type goes on that
// sink and how large an event becomes there, so that Emit refuses at
// write time what the sink would refuse. It links no client library: a
// producer sets the routing of the sink its relayer publishes to,
//
//	outbox.Config{Routing: routing.NATS{TopicPrefix: "shop."}}
//
// and the relayer's sink (relay/natspub, ...) returns the same routing
// from its Routing method, so the two agree.
package routing
