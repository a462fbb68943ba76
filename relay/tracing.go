package relay

import (
	"context"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0" // the messaging conventions' attribute keys
	"go.opentelemetry.io/otel/trace"
)

// MessagingSystem is implemented by a Sink that names its broker for
// traces: the messaging.system attribute of the relayer's publish spans
// ("kafka" for kafkapub's). For "kafka" the spans also carry the record
// keys (messaging.kafka.message.key: the aggregate id).
type MessagingSystem interface {
	MessagingSystem() string
}

// tracerName is the instrumentation scope of the relayer's spans.
const tracerName = "github.com/pgoutbox/outbox/relay"

// tracing makes the relayer's publish spans.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	system string
}

func newTracing(cfg Common) tracing {
	t := tracing{tracer: cfg.TracerProvider.Tracer(tracerName), prop: cfg.Propagator}
	if s, ok := cfg.Sink.(MessagingSystem); ok {
		t.system = s.MessagingSystem()
	}
	return t
}

// maxLinksPerSpan is the most links one publish span carries: the SDK's
// default limit (OTEL_SPAN_LINK_COUNT_LIMIT), past which it evicts the
// oldest link, at the cost of a copy of all of them per link added.
const maxLinksPerSpan = 128

// startPublish starts the span of one Publish call: one span for the
// batch, "send <topic>" (kind producer), linked to the trace context each
// message carries; when more than maxLinksPerSpan messages carry one, the
// batch gets one such span per maxLinksPerSpan of them, so every traced
// event links to the send that carried it. Per the conventions a batch
// span carries the per-message attributes (id, key) on its links; a batch
// of one carries them on the span too. When the tracer does not record (no
// SDK, or not sampled) it costs one span start per batch and nothing per
// message. The returned end function records the batch's results.
func (t tracing) startPublish(ctx context.Context, msgs []Message) (context.Context, func(errs []error, err error)) {
	topic := msgs[0].Topic
	for i := 1; i < len(msgs); i++ {
		if msgs[i].Topic != topic {
			topic = "" // several destinations: the span names none
			break
		}
	}
	name := "send"
	if topic != "" {
		name = "send " + topic
	}
	kind := trace.WithSpanKind(trace.SpanKindProducer)
	pctx, span := t.tracer.Start(ctx, name, kind)
	if !span.IsRecording() {
		span.End()
		return pctx, func([]error, error) {}
	}
	attrs := make([]attribute.KeyValue, 0, 7)
	if t.system != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(t.system))
	}
	attrs = append(attrs, semconv.MessagingOperationTypeKey.String("send"), semconv.MessagingOperationNameKey.String("send"))
	if topic != "" {
		attrs = append(attrs, semconv.MessagingDestinationNameKey.String(topic))
	}
	kafka := t.system == "kafka"
	if len(msgs) == 1 {
		attrs = append(attrs, semconv.MessagingMessageIDKey.String(strconv.FormatInt(msgs[0].ID, 10)))
		if kafka {
			attrs = append(attrs, semconv.MessagingKafkaMessageKeyKey.String(msgs[0].AggregateID.String()))
		}
	} else {
		attrs = append(attrs, semconv.MessagingBatchMessageCountKey.Int(len(msgs)))
	}
	span.SetAttributes(attrs...)
	spans := []trace.Span{span}
	links := 0
	for i := range msgs {
		m := &msgs[i]
		if len(m.Headers) == 0 {
			continue
		}
		sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.MapCarrier(m.Headers)))
		if !sc.IsValid() {
			continue
		}
		if links == maxLinksPerSpan {
			_, span = t.tracer.Start(ctx, name, kind, trace.WithAttributes(attrs...))
			spans = append(spans, span)
			links = 0
		}
		la := []attribute.KeyValue{semconv.MessagingMessageIDKey.String(strconv.FormatInt(m.ID, 10))}
		if kafka {
			la = append(la, semconv.MessagingKafkaMessageKeyKey.String(m.AggregateID.String()))
		}
		span.AddLink(trace.Link{SpanContext: sc, Attributes: la})
		links++
	}
	return pctx, func(errs []error, err error) {
		for _, span := range spans {
			endPublish(span, errs, err)
		}
	}
}

// endPublish records the batch's results on one of its spans and ends it.
func endPublish(span trace.Span, errs []error, err error) {
	defer span.End()
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String("_OTHER"))
		return
	}
	failed := 0
	var first error
	for _, e := range errs {
		if e != nil {
			if first == nil {
				first = e
			}
			failed++
		}
	}
	if first == nil {
		return
	}
	reason := ReasonOf(first)
	if reason == "" {
		reason = "transient"
	}
	span.RecordError(first)
	span.SetAttributes(semconv.ErrorTypeKey.String(reason))
	span.SetStatus(codes.Error, fmt.Sprintf("%d of %d messages not acknowledged; the first: %v", failed, len(errs), first))
}
