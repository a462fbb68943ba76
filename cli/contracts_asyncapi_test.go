package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

const asyncAPIContracts = "../contracts/asyncapi/testdata/contracts"

// outbox contracts asyncapi writes the document for the sink --sink
// names, to standard output or -o, without connecting to anything.
func TestContractsAsyncAPI(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	code := Main([]string{"contracts", "asyncapi", "--contracts", asyncAPIContracts, "--brokers", "kafka1:9092,kafka2:9092",
		"--topic-prefix", "prod.", "--title", "shop", "--version", "2.0.0", "--cloudevents"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	var doc struct {
		AsyncAPI string                    `json:"asyncapi"`
		Info     map[string]string         `json:"info"`
		Servers  map[string]map[string]any `json:"servers"`
		Channels map[string]struct {
			Address  string         `json:"address"`
			Messages map[string]any `json:"messages"`
		} `json:"channels"`
		Components struct {
			Messages map[string]struct {
				Headers struct {
					Properties map[string]any `json:"properties"`
				} `json:"headers"`
			} `json:"messages"`
		} `json:"components"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &doc), out.String())
	require.Equal(t, "3.0.0", doc.AsyncAPI)
	require.Equal(t, map[string]string{"title": "shop", "version": "2.0.0"}, doc.Info)
	require.Equal(t, "kafka1:9092", doc.Servers["broker"]["host"])
	require.Equal(t, "prod.order", doc.Channels["prod.order"].Address)
	require.Len(t, doc.Channels["prod.order"].Messages, 3)
	require.Contains(t, doc.Components.Messages["order.placed.v2"].Headers.Properties, "ce_source")

	file := filepath.Join(t.TempDir(), "asyncapi.json")
	out.Reset()
	code = Main([]string{"contracts", "asyncapi", "--contracts", asyncAPIContracts, "--sink", "amqp://guest@rabbit:5672/", "-o", file}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.Empty(t, out.String())
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Contains(t, string(b), `"address": "order.placed"`, "RabbitMQ routes by the whole type")
	require.Contains(t, string(b), `"host": "rabbit:5672"`)
	require.NotContains(t, string(b), "guest", "no user in the server")
	require.NotContains(t, string(b), "ce_", "no CloudEvents headers without --cloudevents")
}

// Flags that cannot make a document are refused, saying what to do.
func TestContractsAsyncAPIMistakes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--contracts is required"},
		{[]string{"--contracts", "no/such/dir"}, "no/such/dir"},
		{[]string{"--contracts", asyncAPIContracts, "--sink", "redis://127.0.0.1:6379/0", "--cloudevents"}, "Redis Streams has no CloudEvents protocol binding"},
		{[]string{"--contracts", asyncAPIContracts, "--sink", "nosuch://x"}, "unknown scheme"},
		{[]string{"--contracts", asyncAPIContracts, "--sink", "nats://x:4222", "--brokers", "k:9092"}, "give one of them"},
		{[]string{"--contracts", asyncAPIContracts, "--topic-prefix", "bad prefix"}, "--topic-prefix"},
		{[]string{"--contracts", asyncAPIContracts, "-o", "/no/such/dir/x.json"}, "--file:"},
	} {
		var out, errOut bytes.Buffer
		code := Main(append([]string{"contracts", "asyncapi"}, c.args...), &out, &errOut)
		require.Equal(t, 1, code, "%v: %s", c.args, errOut.String())
		require.Contains(t, errOut.String(), c.want, c.args)
	}
}
