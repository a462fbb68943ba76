package relay

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TracePublish returns the tracing work of one Publish call, as the
// relayer does it for a Kafka publisher, every message acknowledged.
func TracePublish(tp trace.TracerProvider, prop propagation.TextMapPropagator) func(context.Context, []Message) {
	t := tracing{tracer: tp.Tracer(tracerName), prop: prop, system: "kafka"}
	var errs []error
	return func(ctx context.Context, msgs []Message) {
		if len(errs) != len(msgs) {
			errs = make([]error, len(msgs))
		}
		_, end := t.startPublish(ctx, msgs)
		end(errs, nil)
	}
}
