package cli

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// --cloudevents combinations the relay cannot use are refused before
// anything is dialed, and Redis Streams, which has no CloudEvents
// binding, refuses the option by name.
func TestRelayCloudEventsMistakes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--cloudevents-source", "urn:x"}, "add --cloudevents, or drop them"},
		{[]string{"--cloudevents-dataschema", "https://example.com/c/"}, "add --cloudevents, or drop them"},
		{[]string{"--cloudevents", "--cloudevents-source", "orders db"}, `--cloudevents-source: cloudevents: Source "orders db" is not a URI-reference`},
		{[]string{"--cloudevents", "--cloudevents-dataschema", "contracts/"}, "--cloudevents-dataschema: cloudevents: DataSchema \"contracts/\": use an absolute URI ending in '/'"},
		{[]string{"--cloudevents", "--sink", "redis://127.0.0.1:1/0"}, "--cloudevents: Redis Streams has no CloudEvents protocol binding"},
		{[]string{"--cloudevents", "--sink", "rediss://127.0.0.1:1/0"}, "drop --cloudevents"},
	} {
		code, _, stderr := runCLI(t, db, append([]string{"relay"}, c.args...)...)
		require.Equal(t, 1, code, "%v: %s", c.args, stderr)
		require.Contains(t, stderr, c.want, c.args)
		require.NotContains(t, stderr, "cannot reach", "refused before dialing")
	}
}

// relayUntilDispatched runs outbox relay with args until db's outbox
// has no pending row, then stops it.
func relayUntilDispatched(t *testing.T, db *pgtest.DB, args ...string) {
	t.Helper()
	root := NewRoot(&bytes.Buffer{}, &bytes.Buffer{})
	root.SetArgs(append([]string{"relay", "--database-url", db.URL, "--schema", db.Tables.Schema, "--poll-interval", "50ms"}, args...))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Tables.OutboxIdent()+" WHERE dispatched_at IS NULL").Scan(&n))
		return n == 0
	}, 30*time.Second, 50*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop")
	}
}

// insertPlaced writes one order.placed row at contract version 2.
func insertPlaced(t *testing.T, db *pgtest.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), "INSERT INTO "+db.Tables.OutboxIdent()+` (aggregate_id, type, payload, headers) VALUES
		('7d7e1f6c-4a39-4a2e-9c55-0b9a4bb1f001', 'order.placed', '{"total": 1}', '{"event_version": "2"}')`)
	require.NoError(t, err)
}

// With --sink nats:// and https://, --cloudevents reaches the sink: the
// NATS message and the webhook request carry the ce- headers, with the
// source given.
func TestRelayCloudEventsNATSAndWebhook(t *testing.T) {
	t.Parallel()
	t.Run("nats", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		srv := natstest.Start(t)
		_, js := natstest.Connect(t, srv.URL())
		natstest.AddStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"order.>"}})
		insertPlaced(t, db)
		relayUntilDispatched(t, db, "--sink", srv.URL(), "--cloudevents", "--cloudevents-source", "/outbox/orders")
		got := natstest.ReadStream(t, js, "ORDERS", "")
		require.Len(t, got, 1)
		require.Equal(t, "/outbox/orders", got[0].Header.Get("ce-source"))
		require.Equal(t, "order.placed", got[0].Header.Get("ce-type"))
		require.Equal(t, got[0].Header.Get("event_id"), got[0].Header.Get("ce-id"))
	})
	t.Run("webhook", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		var mu sync.Mutex
		var got []http.Header
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = append(got, r.Header.Clone())
			mu.Unlock()
		}))
		t.Cleanup(srv.Close)
		secret := writeFile(t, "secret", testWebhookSecret)
		insertPlaced(t, db)
		relayUntilDispatched(t, db, "--sink", srv.URL+"?secret_file="+url.QueryEscape(secret), "--cloudevents", "--source", "billing")
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, got, 1)
		require.Equal(t, "urn:outbox:billing", got[0].Get("ce-source"), "the default source follows --source")
		require.Equal(t, "urn:outbox:contract:order.placed:v2", got[0].Get("ce-dataschema"))
		require.NotEmpty(t, got[0].Get("webhook-signature"))
	})
}

// outbox relay --cloudevents stamps every record; the source defaults
// to the database and table, the event_version header makes dataschema.
func TestRelayCloudEventsKafka(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b, err := devkafka.Start(devkafka.Config{})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	_, err = db.Pool.Exec(context.Background(), "INSERT INTO "+db.Tables.OutboxIdent()+` (aggregate_id, type, payload, headers) VALUES
		('7d7e1f6c-4a39-4a2e-9c55-0b9a4bb1f001', 'order.placed', '{"total": 1}', '{"event_version": "2"}')`)
	require.NoError(t, err)
	root := NewRoot(&bytes.Buffer{}, &bytes.Buffer{})
	root.SetArgs([]string{"relay", "--database-url", db.URL, "--schema", db.Tables.Schema, "--sink", "kafka://" + b.Addr(), "--poll-interval", "50ms", "--cloudevents"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	recs := kafkatest.Read(t, b.Addr(), 30*time.Second, kafkatest.AtLeast(1), "order")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop")
	}
	h := kafkatest.Headers(recs[0])
	require.Equal(t, "urn:outbox:test%2F"+db.Tables.Schema+".events_outbox", h["ce_source"], "database/schema.table")
	require.Equal(t, h["event_id"], h["ce_id"])
	require.Equal(t, "order.placed", h["ce_type"])
	require.Equal(t, "7d7e1f6c-4a39-4a2e-9c55-0b9a4bb1f001", h["ce_subject"])
	require.Equal(t, "urn:outbox:contract:order.placed:v2", h["ce_dataschema"])
	require.Equal(t, "1.0", h["ce_specversion"])
	_, err = time.Parse(time.RFC3339Nano, h["ce_time"])
	require.NoError(t, err)
}
