// Package sinktest is the conformance suite every sink passes: a sink's
// own tests run it against the sink's real server, and the suite checks
// what the relayers count on from a relay.Sink.
//
//   - Every acknowledged message reaches its destination byte-exact: the
//     payload as given (non-ASCII text, an empty object, the spacing
//     Postgres writes), every header, the event type, the aggregate, and
//     the event id a deduplicating consumer needs.
//   - Each aggregate's messages reach a destination in the order they
//     were handed over, and a message after a failed one of its aggregate
//     is never acknowledged ahead of it, on whatever destination.
//   - A failure belongs to the message that caused it: messages that only
//     shared a request with it are acknowledged.
//   - Errors are classified: a refusal that retrying cannot fix is
//     permanent (relay.IsPermanent) with one of relay's Reason codes, a
//     message over the sink's size limit is permanent with
//     relay.ReasonTooLarge, and anything a retry may fix is not permanent.
//
// A sink plugs in through a Harness: New builds a fresh sink for one case
// and says how to read back what reached a destination. Fault injection
// is optional, capability by capability (Sink.FailDestination,
// Sink.RefuseMessage, ...): a case that needs one the sink lacks is
// skipped with a message naming the missing field, never passed in
// silence.
//
//	func TestSinkConformance(t *testing.T) {
//		sinktest.Run(t, sinktest.Harness{
//			Name: "mysink",
//			New: func(t *testing.T) *sinktest.Sink {
//				srv := startServer(t) // a server, or a namespace, of its own
//				return &sinktest.Sink{
//					Sink: mysink.New(srv.Addr()),
//					Read: func(t *testing.T, dest string, want int) []sinktest.Delivered {
//						return readAll(t, srv, dest, want)
//					},
//					MaxBytes: srv.MaxMessageBytes(),
//				}
//			},
//		})
//	}
//
// The suite names its destinations itself, fresh for every case: lowercase
// letters, digits and '-', at most 40 characters (valid for Kafka topics,
// NATS subjects, RabbitMQ queues, Redis keys and file names alike).
// Every case runs as a parallel subtest.
package sinktest
