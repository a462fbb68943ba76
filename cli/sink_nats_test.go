package cli

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

func TestParseNATSURL(t *testing.T) {
	t.Parallel()
	creds := filepath.Join(t.TempDir(), "relay.creds")
	require.NoError(t, os.WriteFile(creds, []byte("x"), 0o600))
	noEnv := func(string) string { return "" }
	parse := func(raw string, getenv func(string) string) (natsSinkConfig, error) {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		return parseNATSURL(u, getenv)
	}
	c, err := parse("nats://a:4222,b:4223?max_payload_bytes=2048&max_in_flight=16&name=r1&creds="+creds, noEnv)
	require.NoError(t, err)
	require.Equal(t, []string{"nats://a:4222", "nats://b:4223"}, c.servers)
	require.Equal(t, 2048, c.pub.MaxPayloadBytes)
	require.Equal(t, 16, c.pub.MaxInFlight)

	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	_, err = parse("nats://a:4222", env(map[string]string{envNATSUser: "u", envNATSPassword: "p"}))
	require.NoError(t, err)
	for raw, want := range map[string]string{
		"nats://u:s3cret@a:4222":            "put no user or password in the URL",
		"nats://":                           "--sink nats://host:port",
		"nats://a:4222/path":                "--sink nats://host:port",
		"nats://a:4222?bogus=1":             "?bogus=: unknown setting; use max_payload_bytes",
		"nats://a:4222?max_payload_bytes=x": "max_payload_bytes=x: use a positive whole number",
		"nats://a:4222?max_in_flight=0":     "max_in_flight=0: use a positive whole number",
		"nats://a:4222?creds=/no/such":      "give the path of a .creds file",
		"nats://a:4222?tls_ca=/no/such":     "give the path of a PEM file",
	} {
		_, err := parse(raw, noEnv)
		require.ErrorContains(t, err, want, raw)
		require.NotContains(t, err.Error(), "s3cret")
	}
	_, err = parse("nats://a:4222", env(map[string]string{envNATSToken: "t", envNATSUser: "u"}))
	require.ErrorContains(t, err, "set one way to authenticate")
	_, err = parse("nats://a:4222", env(map[string]string{envNATSPassword: "p"}))
	require.ErrorContains(t, err, "OUTBOX_NATS_PASSWORD is set without OUTBOX_NATS_USER")
}

// --sink nats://... relays every event to the stream that captures its
// subject, with the event id and a source-qualified Nats-Msg-Id.
func TestRelaySinkNATSPublishes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	natstest.AddStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"shop.order.>"}})
	_, err := db.Pool.Exec(context.Background(), "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload) SELECT gen_random_uuid(), 'order.placed', '{}' FROM generate_series(1, 50)")
	require.NoError(t, err)

	relayUntilDispatched(t, db, "--sink", srv.URL(), "--topic-prefix", "shop.", "--source", "eu")
	got := natstest.ReadStream(t, js, "ORDERS", "shop.order.placed")
	require.Len(t, got, 50)
	for _, m := range got {
		id := m.Header.Get("event_id")
		_, err := strconv.ParseInt(id, 10, 64)
		require.NoError(t, err)
		require.Equal(t, "eu:"+id, m.Header.Get("Nats-Msg-Id"))
	}
}
