package outbox

import "context"

// TraceHeaders is what p adds to an event's headers for ctx's span, merged
// into h as Emit merges it.
func TraceHeaders(p *Producer, ctx context.Context, h map[string]string) map[string]string {
	return withTrace(h, p.traceHeaders(ctx))
}
