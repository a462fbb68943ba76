// Package cetest reads what a sink published with the npm CloudEvents SDK
// (cloudevents 10.0.0), a consumer no one here wrote: its bindings parse
// the messages and its validation checks them against the spec. Tests
// that use it need node and npm; under CI=true a missing one fails them.
package cetest

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/npmtest"
)

//go:embed sdk.js
var script []byte

//go:embed package.json
var pkg []byte

// Message is one message as a consumer received it.
type Message struct {
	// Binding is "http" (HTTP.toEvent) or "kafka" (Kafka.toEvent).
	Binding string            `json:"binding"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
	// Key is the Kafka record key.
	Key string `json:"key,omitempty"`
}

// Parsed is what the SDK made of a Message: the event as its JSON
// format, or why it refused the message.
type Parsed struct {
	Event map[string]any `json:"event"`
	Error string         `json:"error"`
}

// SDK installs the npm cloudevents package in a directory of the test's
// own and returns a func that parses messages with it.
func SDK(t testing.TB) func(msgs []Message) []Parsed {
	t.Helper()
	dir, node := npmtest.Install(t, map[string][]byte{"package.json": pkg, "sdk.js": script}, "the CloudEvents SDK's check of these events")
	return func(msgs []Message) []Parsed {
		t.Helper()
		in, err := json.Marshal(msgs)
		require.NoError(t, err)
		cmd := exec.Command(node, "sdk.js")
		cmd.Dir, cmd.Stdin = dir, bytes.NewReader(in)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		raw, err := cmd.Output()
		require.NoError(t, err, "node sdk.js: %s", stderr.String())
		var res []Parsed
		require.NoError(t, json.Unmarshal(raw, &res), string(raw))
		require.Len(t, res, len(msgs))
		return res
	}
}
