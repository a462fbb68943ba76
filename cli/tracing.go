package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// tracingFlushTimeout bounds the export of the last spans when a command
// ends: a collector that is down must not hold up shutdown.
const tracingFlushTimeout = 5 * time.Second

// tracingEnabled reports whether the environment asks for trace export:
// an OTLP endpoint is set, and neither OTEL_SDK_DISABLED=true nor
// OTEL_TRACES_EXPORTER=none turns it off.
func tracingEnabled(getenv func(string) string) bool {
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return false
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	return !strings.EqualFold(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")), "none")
}

// tracingProtocol checks the OTLP protocol the environment asks for:
// this binary carries only the HTTP exporter (the gRPC one would link the
// whole gRPC stack).
func tracingProtocol(getenv func(string) string) error {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		switch p := strings.TrimSpace(getenv(name)); p {
		case "":
			continue // the generic variable may still say
		case "http/protobuf":
			return nil
		default:
			return fmt.Errorf("%s=%s: outbox exports traces over OTLP/HTTP with protobuf only; set it to http/protobuf (or unset it) and point OTEL_EXPORTER_OTLP_ENDPOINT at the collector's OTLP/HTTP port, e.g. http://localhost:4318", name, p)
		}
	}
	return nil
}

// startTracing installs OpenTelemetry trace export for the command c when
// the standard environment variables ask for it (tracingEnabled), and does
// nothing otherwise: no provider is installed and nothing is dialed. The
// SDK reads the rest of the standard variables itself:
// OTEL_EXPORTER_OTLP_{,TRACES_}{ENDPOINT,HEADERS,TIMEOUT,COMPRESSION,...},
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (the service name
// defaults to "outbox"), OTEL_TRACES_SAMPLER{,_ARG} and OTEL_BSP_*. It
// sets the global TracerProvider, which the relayer and consumer use by
// default, and the global propagator (W3C Trace Context and Baggage); when
// the command's run ends, successfully or not, the spans still buffered
// are flushed and the globals are put back.
func startTracing(c *cobra.Command, log *slog.Logger) error {
	if !tracingEnabled(os.Getenv) {
		return nil
	}
	if err := tracingProtocol(os.Getenv); err != nil {
		return err
	}
	if err := tracingEndpointCheck(os.Getenv); err != nil {
		return err
	}
	// The SDK reports its own trouble through its global logger (to
	// stderr, quoting what it could not parse: a header's value, a URL)
	// and its error handler: both go to the command's log, redacted.
	otel.SetLogger(logr.New(otelLogSink{log: log}))
	ctx := c.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return fmt.Errorf("OTLP trace exporter (from OTEL_EXPORTER_OTLP_*): %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", "outbox")),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
	)
	if err != nil {
		return fmt.Errorf("trace resource (from OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	// The sampler comes from OTEL_TRACES_SAMPLER (default: parent-based,
	// always on), the batcher's limits from OTEL_BSP_*.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	prevTP, prevProp, prevErr := otel.GetTracerProvider(), otel.GetTextMapPropagator(), otel.GetErrorHandler()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("trace export failed", "err", redactURLs(err.Error()))
	}))
	log.Info("exporting traces over OTLP/HTTP", "endpoint", tracingEndpoint(os.Getenv))

	stop := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingFlushTimeout)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("flushing traces failed; the last spans may be lost", "err", err)
		}
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
		otel.SetErrorHandler(prevErr)
		// The command's log is done with; the SDK's default logger would
		// print unredacted.
		otel.SetLogger(logr.Discard())
	}
	// Flush when the command's run returns, whether it failed or not
	// (cobra runs PostRun hooks only after a success).
	switch {
	case c.RunE != nil:
		run := c.RunE
		c.RunE = func(c *cobra.Command, args []string) error {
			defer stop()
			return run(c, args)
		}
	case c.Run != nil:
		run := c.Run
		c.Run = func(c *cobra.Command, args []string) {
			defer stop()
			run(c, args)
		}
	default:
		stop()
	}
	return nil
}

// tracingEndpointCheck refuses an OTLP endpoint the exporter would not
// use as given: one that is not an http:// or https:// URL with a host
// (the exporter logs it, credentials and all, and exports nowhere), or
// one that carries credentials, which the exporter drops. Its message
// shows the value with any credentials redacted.
func tracingEndpointCheck(getenv func(string) string) error {
	const fix = "set it to the collector's OTLP/HTTP URL, e.g. http://localhost:4318"
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		v := getenv(name)
		if v == "" {
			continue
		}
		shown := redactURLs(v)
		u, err := url.Parse(v)
		var uerr *url.Error
		switch {
		case errors.As(err, &uerr):
			return fmt.Errorf("%s=%s is not a URL (%s); %s", name, shown, redactURLs(uerr.Err.Error()), fix)
		case err != nil:
			return fmt.Errorf("%s=%s is not a URL; %s", name, shown, fix)
		case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
			return fmt.Errorf("%s=%s is not an http:// or https:// URL with a host; %s", name, shown, fix)
		case u.User != nil:
			return fmt.Errorf("%s=%s holds credentials, which the OTLP exporter does not send; remove them from the URL and "+
				"pass them as a header: OTEL_EXPORTER_OTLP_HEADERS=Authorization=Basic%%20<base64 of user:password>", name, shown)
		}
	}
	return nil
}

// userinfo is the credentials part of a URL, as scheme://user:password@;
// urlQuery the query and fragment of a URL, where collectors' API keys
// often travel (?api_key=...).
var (
	userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s"']*@`)
	urlQuery = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^?#\s"']*)[?#][^\s"']*`)
)

// redactURLs replaces the credentials, the query and the fragment of every
// URL in s, parsable or not, with xxxxx.
func redactURLs(s string) string {
	s = userinfo.ReplaceAllString(s, "${1}xxxxx@")
	return urlQuery.ReplaceAllString(s, "${1}?xxxxx")
}

// otelLogSink is the OpenTelemetry SDK's global logger: its errors and
// warnings go to the command's log. Only the message, the error (its URLs
// redacted) and file names are kept: the SDK's other values quote what it
// failed to parse, such as a header that holds a token.
type otelLogSink struct{ log *slog.Logger }

func (s otelLogSink) Init(logr.RuntimeInfo) {}

// Enabled lets errors and warnings through (otel logs warnings at V(1),
// info at V(4) and debug at V(8)).
func (s otelLogSink) Enabled(level int) bool { return level <= 1 }

func (s otelLogSink) Info(_ int, msg string, kv ...any) {
	s.log.Warn("OpenTelemetry: "+redactURLs(msg), s.attrs(kv)...)
}

func (s otelLogSink) Error(err error, msg string, kv ...any) {
	args := s.attrs(kv)
	if err != nil {
		args = append(args, "err", redactURLs(err.Error()))
	}
	s.log.Warn("OpenTelemetry: "+redactURLs(msg), args...)
}

func (s otelLogSink) attrs(kv []any) []any {
	var args []any
	for i := 0; i+1 < len(kv); i += 2 {
		if k, ok := kv[i].(string); ok && k == "file" {
			args = append(args, k, fmt.Sprint(kv[i+1]))
		}
	}
	return args
}

func (s otelLogSink) WithValues(...any) logr.LogSink { return s }

func (s otelLogSink) WithName(string) logr.LogSink { return s }

// tracingEndpoint is where spans go, for the log, without credentials.
func tracingEndpoint(getenv func(string) string) string {
	e := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if e == "" {
		e = getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	u, err := url.Parse(e)
	if err != nil {
		return "(unparsable)"
	}
	return redactURLs(u.Redacted())
}
