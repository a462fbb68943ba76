package asyncapi_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/contracts"
	"github.com/pgoutbox/outbox/contracts/asyncapi"
	"github.com/pgoutbox/outbox/internal/npmtest"
	"github.com/pgoutbox/outbox/routing"
)

const dir = "testdata/contracts"

// parsed is what the AsyncAPI parser made of one document.
type parsed struct {
	Diagnostics []struct {
		Code     string `json:"code"`
		Message  string `json:"message"`
		Path     []any  `json:"path"`
		Severity int    `json:"severity"`
	} `json:"diagnostics"`
	Channels []string `json:"channels"`
	Messages []struct {
		Name    string         `json:"name"`
		Payload map[string]any `json:"payload"`
		Headers []string       `json:"headers"`
	} `json:"messages"`
	Operations []string `json:"operations"`
}

// parse runs the npm @asyncapi/parser on docs, installed in a directory
// of the test's own.
func parse(t *testing.T, docs ...map[string]any) []parsed {
	t.Helper()
	tmp, node := npmtest.Install(t, npmtest.Files(t, filepath.Join("testdata", "parser"), "package.json", "parse.js"),
		"the AsyncAPI parser's check of the documents")
	args := []string{"parse.js"}
	for i, d := range docs {
		b, err := json.MarshalIndent(d, "", "  ")
		require.NoError(t, err)
		name := filepath.Join(tmp, "doc"+string(rune('a'+i))+".json")
		require.NoError(t, os.WriteFile(name, b, 0o600))
		args = append(args, name)
	}
	cmd := exec.Command(node, args...)
	cmd.Dir = tmp
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	require.NoError(t, err, "node parse.js: %s", stderr.String())
	var res []parsed
	require.NoError(t, json.Unmarshal(raw, &res), string(raw))
	require.Len(t, res, len(docs))
	return res
}

func build(t *testing.T, o asyncapi.Options) map[string]any {
	t.Helper()
	set, err := contracts.Load(dir)
	require.NoError(t, err)
	doc, err := asyncapi.Build(set, os.DirFS(dir), o)
	require.NoError(t, err)
	return doc
}

// The AsyncAPI parser reads the documents for every sink without an
// error: a channel per destination, a message per type and version whose
// payload is the contract with its $refs (local, and to a shared file)
// embedded, and the relayer's headers.
func TestAsyncAPIParserAcceptsTheDocuments(t *testing.T) {
	t.Parallel()
	kafkaCE := cloudevents.Kafka
	natsCE := cloudevents.NATS
	docs := []map[string]any{
		build(t, asyncapi.Options{Routing: outbox.KafkaRouting{TopicPrefix: "prod."}, Host: "127.0.0.1:9092", CloudEvents: &kafkaCE, Title: "shop", Version: "2.1.0"}),
		build(t, asyncapi.Options{Routing: routing.NATS{}, Protocol: "nats", Host: "127.0.0.1:4222", AggregateHeader: true, CloudEvents: &natsCE}),
		build(t, asyncapi.Options{Routing: routing.AMQP{TopicPrefix: "shop."}, Protocol: "amqp", AggregateHeader: true}),
		build(t, asyncapi.Options{Routing: routing.Webhook{}, Protocol: "https", AggregateHeader: true}),
		build(t, asyncapi.Options{Routing: routing.Redis{}, Protocol: "redis", AggregateHeader: true}),
	}
	res := parse(t, docs...)
	for i, r := range res {
		for _, d := range r.Diagnostics {
			if d.Severity == 0 {
				b, _ := json.MarshalIndent(docs[i], "", "  ")
				t.Fatalf("document %d: the parser reports %s at %v: %s\nall diagnostics: %+v\ndocument:\n%s", i, d.Code, d.Path, d.Message, r.Diagnostics, b)
			}
		}
	}
	k := res[0]
	require.Equal(t, []string{"prod.order"}, k.Channels, "Kafka: one topic for both types")
	require.Len(t, k.Messages, 3, "order.placed v1, v2 and order.shipped v1")
	require.Equal(t, []string{"send prod.order"}, k.Operations)
	for _, m := range k.Messages {
		require.Contains(t, m.Headers, "event_id")
		require.Contains(t, m.Headers, "event_version")
		require.Contains(t, m.Headers, "ce_id")
		require.NotContains(t, m.Headers, "ce_datacontenttype", "Kafka carries it in content-type")
		require.NotContains(t, m.Headers, "aggregate_id", "Kafka's key carries it")
	}
	require.ElementsMatch(t, []string{"order.placed", "order.shipped"}, res[1].Channels, "NATS: a subject per type")
	require.Contains(t, res[1].Messages[0].Headers, "ce-datacontenttype")
	require.Contains(t, res[1].Messages[0].Headers, "aggregate_id")
	require.ElementsMatch(t, []string{"shop.order.placed", "shop.order.shipped"}, res[2].Channels)

	var v2 map[string]any
	for _, m := range k.Messages {
		if props, _ := m.Payload["properties"].(map[string]any); props != nil && props["lines"] != nil {
			v2 = m.Payload
		}
	}
	require.NotNil(t, v2, "order.placed v2's payload")
	total := v2["properties"].(map[string]any)["total"].(map[string]any)
	require.Equal(t, []any{"amount", "currency"}, total["required"], "the shared file is embedded and resolved")
	cur := total["properties"].(map[string]any)["currency"].(map[string]any)
	require.Equal(t, "^[A-Z]{3}$", cur["pattern"], "its own local $ref resolves in its copy")
	require.Equal(t, float64(1), v2["properties"].(map[string]any)["order_id"].(map[string]any)["minLength"], "a local $ref resolves")
}

// Build refuses what it cannot describe, saying why.
func TestAsyncAPIBuildMistakes(t *testing.T) {
	t.Parallel()
	set, err := contracts.Load(dir)
	require.NoError(t, err)
	_, err = asyncapi.Build(set, os.DirFS(dir), asyncapi.Options{})
	require.ErrorContains(t, err, "Options.Routing is nil")
	_, err = asyncapi.Build(set, os.DirFS(dir), asyncapi.Options{Routing: outbox.KafkaRouting{TopicPrefix: "bad prefix "}})
	require.ErrorIs(t, err, outbox.ErrInvalidTopic)
	empty := t.TempDir()
	set, err = contracts.Load(empty)
	require.NoError(t, err)
	_, err = asyncapi.Build(set, os.DirFS(empty), asyncapi.Options{Routing: outbox.KafkaRouting{}})
	require.ErrorContains(t, err, "holds no event type")
}
