package cli

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// collector is an OTLP/HTTP endpoint that keeps what it is sent.
type collector struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []collected
}

type collected struct {
	path, contentType string
	body              []byte
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.reqs = append(c.reqs, collected{r.URL.Path, r.Header.Get("Content-Type"), body})
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *collector) requests() []collected {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]collected(nil), c.reqs...)
}

// clearOTelEnv unsets the variables that could turn export on or change
// it, so the tests see only what they set. (t.Setenv: these tests cannot
// run in parallel.)
func clearOTelEnv(t *testing.T) {
	for _, v := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER"} {
		t.Setenv(v, "")
	}
}

// `outbox relay` with OTEL_EXPORTER_OTLP_ENDPOINT set exports its publish
// spans over OTLP/HTTP, flushed when the command ends, and puts the global
// provider back.
func TestRelayExportsTraces(t *testing.T) {
	clearOTelEnv(t)
	col := newCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "relay-under-test")
	db := pgtest.New(t)
	broker, err := devkafka.Start(devkafka.Config{Partitions: 1})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	emit(t, db, uuid.New(), "order.placed", map[string]int{"n": 1})

	relay := startCommand(t, db, "relay", "--brokers", broker.Addr(), "--poll-interval", "50ms", "--cleanup-interval", "0")
	require.Eventually(t, func() bool { return count(t, db, "dispatched_at IS NULL") == 0 }, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, relay.stop())
	require.Contains(t, relay.stderr.String(), "exporting traces over OTLP/HTTP")

	reqs := col.requests()
	require.NotEmpty(t, reqs, "the spans are flushed when the command ends")
	var names []string
	var service string
	for _, r := range reqs {
		require.Equal(t, "/v1/traces", r.path)
		require.Equal(t, "application/x-protobuf", r.contentType)
		var req coltracepb.ExportTraceServiceRequest
		require.NoError(t, proto.Unmarshal(r.body, &req))
		for _, rs := range req.GetResourceSpans() {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.GetKey() == "service.name" {
					service = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					names = append(names, s.GetName())
				}
			}
		}
	}
	require.Contains(t, names, "send order")
	require.Equal(t, "relay-under-test", service, "OTEL_SERVICE_NAME is honoured")
	_, sdk := otel.GetTracerProvider().(*sdktrace.TracerProvider)
	require.False(t, sdk, "the global provider is put back when the command ends")
}

// Without the variables nothing is installed and nothing is sent.
func TestNoTracingWithoutEnvironment(t *testing.T) {
	clearOTelEnv(t)
	col := newCollector(t)
	db := pgtest.New(t)
	broker, err := devkafka.Start(devkafka.Config{Partitions: 1})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	emit(t, db, uuid.New(), "order.placed", map[string]int{"n": 1})

	relay := startCommand(t, db, "relay", "--brokers", broker.Addr(), "--poll-interval", "50ms", "--cleanup-interval", "0")
	require.Eventually(t, func() bool { return count(t, db, "dispatched_at IS NULL") == 0 }, 30*time.Second, 20*time.Millisecond)
	_, sdk := otel.GetTracerProvider().(*sdktrace.TracerProvider)
	require.False(t, sdk, "no SDK provider while the relay runs")
	require.NoError(t, relay.stop())
	require.NotContains(t, relay.stderr.String(), "exporting traces")
	require.Empty(t, col.requests())
}

// OTLP over gRPC is refused with an error that says what to set.
func TestTracingRefusesGRPC(t *testing.T) {
	clearOTelEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	var out, errOut bytes.Buffer
	require.Equal(t, 1, Main([]string{"migrate", "print"}, &out, &errOut))
	require.Contains(t, errOut.String(), "OTEL_EXPORTER_OTLP_PROTOCOL=grpc")
	require.Contains(t, errOut.String(), "http/protobuf")
}

func TestTracingEnabled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
	} {
		require.Equal(t, tc.want, tracingEnabled(func(k string) string { return tc.env[k] }), "%v", tc.env)
	}
	for _, tc := range []struct {
		env map[string]string
		ok  bool
	}{
		{nil, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, false},
	} {
		err := tracingProtocol(func(k string) string { return tc.env[k] })
		require.Equal(t, tc.ok, err == nil, "%v: %v", tc.env, err)
	}
}

// runMainProcess runs `outbox args...` in a process of its own (this test
// binary, through TestMain) with env added to an environment without
// OTEL_ variables, and returns its exit code and everything it wrote.
func runMainProcess(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, mainEnv+"="+strings.Join(args, " ")), env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), string(out)
	}
	require.NoError(t, err)
	return 0, string(out)
}

// A password in the OTLP endpoint, or a token in a malformed
// OTEL_EXPORTER_OTLP_HEADERS, is never printed: not by the command's
// errors and logs, nor by the OpenTelemetry SDK's own logger. A bad
// endpoint is refused with its credentials redacted.
func TestTracingNeverPrintsCredentials(t *testing.T) {
	t.Parallel()
	const secret = "s3cretpw"
	for _, tc := range []struct {
		name, want string
		code       int
		env        []string
	}{
		{"unparsable endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT=http://xxxxx@host:bad is not a URL", 1,
			[]string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://u:" + secret + "@host:bad"}},
		{"endpoint with credentials", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://xxxxx@127.0.0.1:1/v1/traces holds credentials", 1,
			[]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://u:" + secret + "@127.0.0.1:1/v1/traces"}},
		{"endpoint without scheme", "OTEL_EXPORTER_OTLP_ENDPOINT=collector:4318 is not an http:// or https:// URL", 1,
			[]string{"OTEL_EXPORTER_OTLP_ENDPOINT=collector:4318"}},
		{"endpoint with a key in its query", "endpoint=http://127.0.0.1:1/v1?xxxxx", 0,
			[]string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1/v1?api_key=" + secret + "#x"}},
		{"malformed headers", "OpenTelemetry: parse headers", 0,
			[]string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_HEADERS=Authorization Bearer " + secret}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out := runMainProcess(t, tc.env, "migrate", "print", "--from", "1")
			t.Logf("output:\n%s", out)
			require.Equal(t, tc.code, code)
			require.NotContains(t, out, secret)
			require.Contains(t, out, tc.want)
		})
	}
}
