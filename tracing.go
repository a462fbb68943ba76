package outbox

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Trace context headers (W3C Trace Context), as Emit writes them with the
// default propagator and as the relayer and consumers read them.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// traceHeaders returns the headers the producer's propagator injects for
// the span in ctx, or nil when ctx holds no valid span context: then it
// costs a context lookup and allocates nothing.
func (p *Producer) traceHeaders(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	carrier := propagation.MapCarrier{}
	p.cfg.Propagator.Inject(ctx, carrier)
	return carrier
}

// withTrace returns the event's headers with the trace context headers tc
// added. The caller's headers win: a header the caller set is kept, and a
// caller that set traceparent owns the whole trace context (its
// traceparent is not paired with the span's tracestate). The caller's map
// is never modified; h itself is returned when nothing is added.
func withTrace(h, tc map[string]string) map[string]string {
	if len(tc) == 0 {
		return h
	}
	_, ownTrace := h[HeaderTraceparent]
	var out map[string]string
	for k, v := range tc {
		if _, set := h[k]; set || ownTrace && (k == HeaderTraceparent || k == HeaderTracestate) {
			continue
		}
		if out == nil {
			out = make(map[string]string, len(h)+len(tc))
			for hk, hv := range h {
				out[hk] = hv
			}
		}
		out[k] = v
	}
	if out == nil {
		return h
	}
	return out
}

// defaultPropagator is Config.Propagator's default: W3C Trace Context.
func defaultPropagator() propagation.TextMapPropagator { return propagation.TraceContext{} }
