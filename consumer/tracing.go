package consumer

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0" // the messaging conventions' attribute keys
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the consumer's spans.
const tracerName = "github.com/pgoutbox/outbox/consumer"

// tracing makes the consumer's process spans.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	// system is the messaging.system attribute; Kafka's spans also carry
	// the partition, the offset and the key.
	system string
	// group is the consumer group (Kafka's) or the consumer's name.
	group string
}

// startProcess starts the span of one handler call. When the tracer does
// not record, the span is not recording either and costs the extraction of
// the trace context, which the handler's ctx then carries: an event the
// handler emits continues the producer's trace.
func (t tracing) startProcess(ctx context.Context, ev Event) (context.Context, trace.Span) {
	if len(ev.Headers) > 0 {
		ctx = t.prop.Extract(ctx, propagation.MapCarrier(ev.Headers))
	}
	producer := trace.SpanContextFromContext(ctx)
	ctx, span := t.tracer.Start(ctx, "process "+ev.Topic, trace.WithSpanKind(trace.SpanKindConsumer))
	if !span.IsRecording() {
		return ctx, span
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(t.system),
		semconv.MessagingOperationTypeKey.String("process"),
		semconv.MessagingOperationNameKey.String("process"),
		semconv.MessagingDestinationNameKey.String(ev.Topic),
		semconv.MessagingConsumerGroupNameKey.String(t.group),
		semconv.MessagingMessageIDKey.String(strconv.FormatInt(ev.ID, 10)),
	}
	if t.system == DefaultSystem {
		attrs = append(attrs, semconv.MessagingDestinationPartitionIDKey.String(strconv.FormatInt(int64(ev.Partition), 10)),
			semconv.MessagingKafkaOffsetKey.Int64(ev.Offset))
		if ev.AggregateID != [16]byte{} {
			attrs = append(attrs, semconv.MessagingKafkaMessageKeyKey.String(ev.AggregateID.String()))
		}
	}
	span.SetAttributes(attrs...)
	if producer.IsValid() {
		span.AddLink(trace.Link{SpanContext: producer})
	}
	return ctx, span
}

// endProcess records the handler's error on span and ends it.
func endProcess(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		typ := "handler"
		if IsPermanent(err) {
			typ = "permanent"
		}
		if _, ok := err.(*PanicError); ok {
			typ = "panic"
		}
		span.SetAttributes(semconv.ErrorTypeKey.String(typ))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
