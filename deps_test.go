package outbox_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Imports point one way: a service that only emits or only consumes links
// neither the relayer, nor the migrator, nor a fake broker, and nothing a
// production binary runs links the dev broker. The libraries trace through
// the OpenTelemetry API alone: the SDK and the exporters (and the gRPC
// stack an OTLP exporter brings) are the application's choice, linked only
// by the CLI. go list -deps is the
// authority on what a package links, so ask it. A program that only checks
// or cleans an outbox (package ops: a cron job, a probe) links neither
// Prometheus nor a Kafka client: those are the monitor's (ops/monitor) and
// the consumer's; and a consumer's metrics (consumer/consumermetrics) link
// nothing of the relay or of ops.
func TestImportsPointOneWay(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the go tool is not on PATH (%v); CI must run this test", err)
		}
		t.Skipf("the go tool is not on PATH (%v); cannot list dependencies", err)
	}
	const (
		mod      = "github.com/pgoutbox/outbox"
		relay    = mod + "/relay"
		migrate  = mod + "/migrate"
		devkafka = mod + "/devkafka"
		kfake    = "github.com/twmb/franz-go/pkg/kfake"
		otelSDK  = "go.opentelemetry.io/otel/sdk"
		otelExp  = "go.opentelemetry.io/otel/exporters"
		otlp     = "go.opentelemetry.io/proto/otlp"
		grpc     = "google.golang.org/grpc"
		ops      = mod + "/ops"
		prom     = "github.com/prometheus"
		franz    = "github.com/twmb/franz-go"
	)
	forbidden := map[string][]string{
		".":                          {relay, migrate, devkafka, kfake, otelSDK, otelExp, otlp, grpc},
		"./consumer":                 {relay, migrate, devkafka, kfake, otelSDK, otelExp, otlp, grpc},
		"./kafka":                    {mod, relay, migrate, devkafka, kfake},
		"./relay":                    {devkafka, kfake, otelSDK, otelExp, otlp, grpc},
		"./relay/kafkapub":           {devkafka, kfake, otelSDK, otelExp, otlp, grpc},
		"./migrate":                  {relay, devkafka, kfake},
		"./ops":                      {devkafka, kfake, prom, franz, otelSDK, otelExp, otlp, grpc},
		"./ops/switchover":           {devkafka, kfake, prom, franz, otelSDK, otelExp, otlp, grpc},
		"./ops/monitor":              {devkafka, kfake, otelSDK, otelExp, otlp, grpc},
		"./consumer/consumermetrics": {relay, ops, migrate, devkafka, kfake, otelSDK, otelExp, otlp, grpc},
		// A producer sets the routing of its sink: it links no client.
		"./routing": {relay, migrate, devkafka, kfake, franz, prom, "github.com/nats-io", "github.com/rabbitmq", "github.com/redis", otelSDK, otelExp, otlp, grpc},
		// Routings size events with it, so it links no more than they do.
		"./cloudevents": {mod, devkafka, franz, prom, "github.com/nats-io", "github.com/rabbitmq", "github.com/redis", "go.opentelemetry.io"},
	}
	for pkg, bad := range forbidden {
		out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}", pkg).Output()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, ee.Stderr)
		}
		require.NoError(t, err, pkg)
		deps := strings.Fields(string(out))
		require.NotEmpty(t, deps, pkg)
		self := deps[len(deps)-1] // -deps lists a package after its dependencies
		for _, dep := range deps[:len(deps)-1] {
			for _, b := range bad {
				if dep == b || strings.HasPrefix(dep, b+"/") {
					t.Errorf("%s imports %s (directly or not): it must not link %s", self, dep, b)
				}
			}
		}
	}
}
