package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// syncBuffer is a buffer a test reads while a command writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// background is a long-running command (relay, consume) started in-process.
type background struct {
	stdout, stderr syncBuffer
	done           chan error
	// stop cancels the command's context, as SIGINT/SIGTERM do, and
	// returns its error.
	stop func() error
}

// startCommand runs `outbox args...` against db's schema until stop or the
// end of the test.
func startCommand(t *testing.T, db *pgtest.DB, args ...string) *background {
	t.Helper()
	b := &background{done: make(chan error, 1)}
	root := NewRoot(&b.stdout, &b.stderr)
	root.SetArgs(append(args, "--database-url", db.URL, "--schema", db.Tables.Schema))
	ctx, cancel := context.WithCancel(context.Background())
	go func() { b.done <- root.ExecuteContext(ctx) }()
	var once sync.Once
	var err error
	b.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-b.done:
			case <-time.After(30 * time.Second):
				err = errors.New("the command did not stop within 30s of cancellation")
			}
			if err != nil || t.Failed() {
				t.Logf("outbox %s stderr:\n%s", args[0], b.stderr.String())
			}
		})
		return err
	}
	t.Cleanup(func() { _ = b.stop() })
	return b
}

func (b *background) lines() []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(b.stdout.String()))
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// caughtUp reports whether group has committed offsets at the end of every
// partition of topics, and read at least one record.
func caughtUp(t *testing.T, broker *devkafka.Broker, group string, topics ...string) bool {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker.Addr()))
	require.NoError(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topics...)
	require.NoError(t, err)
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return false // the group does not exist yet
	}
	var total int64
	behind := false
	ends.Each(func(o kadm.ListedOffset) {
		total += o.Offset
		if c, ok := committed.Lookup(o.Topic, o.Partition); o.Offset > 0 && (!ok || c.At < o.Offset) {
			behind = true
		}
	})
	return total > 0 && !behind
}

func processedCount(t *testing.T, db *pgtest.DB, name string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+db.Tables.ProcessedIdent()+" WHERE $1 = '' OR consumer = $1", name).Scan(&n))
	return n
}

// Events emitted with Emit and published by `outbox relay` come out of
// `outbox consume` as one JSON line each, once per consumer name: a second
// run under the same name (in a new group, so Kafka delivers everything
// again) prints nothing, a run under another name prints them all again.
func TestConsumePrintsEachEventOncePerName(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	broker, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	const prefix = "consume_"
	topics := prefix + "order," + prefix + "payment"

	type emitted struct {
		agg     uuid.UUID
		typ     string
		payload string
	}
	order := uuid.New()
	want := map[int64]emitted{}
	for _, e := range []emitted{
		{order, "order.placed", `{"order_id": "o-1", "total_cents": 1999, "note": "<b>&</b> ü"}`},
		{order, "order.paid", `{"order_id": "o-1"}`},
		{uuid.New(), "order.placed", `{"order_id": "o-2", "items": [1, 2, 3]}`},
		{uuid.New(), "payment.captured", `{"amount": 12.5}`},
		{uuid.New(), "payment.captured", `[]`},
	} {
		want[emit(t, db, e.agg, e.typ, json.RawMessage(e.payload))] = e
	}
	emit(t, db, uuid.New(), "shipment.sent", map[string]int{"n": 1}) // a topic not consumed

	relay := startCommand(t, db, "relay", "--brokers", broker.Addr(), "--topic-prefix", prefix, "--source", "shop",
		"--poll-interval", "50ms", "--cleanup-interval", "0")
	require.Eventually(t, func() bool { return count(t, db, "dispatched_at IS NULL") == 0 }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, relay.stop())

	consume := func(args ...string) *background {
		return startCommand(t, db, append([]string{"consume", "--brokers", broker.Addr(), "--topics", topics}, args...)...)
	}
	check := func(lines []string) {
		t.Helper()
		require.Len(t, lines, len(want), "one line per event:\n%s", strings.Join(lines, "\n"))
		seen := map[int64]bool{}
		for _, line := range lines {
			var keys map[string]json.RawMessage
			require.NoError(t, json.Unmarshal([]byte(line), &keys), line)
			require.Len(t, keys, 8, line)
			var got consumedEvent
			dec := json.NewDecoder(strings.NewReader(line))
			dec.DisallowUnknownFields()
			require.NoError(t, dec.Decode(&got), line)
			w, ok := want[got.EventID]
			require.True(t, ok, "unexpected event %d: %s", got.EventID, line)
			require.False(t, seen[got.EventID], "event %d printed twice", got.EventID)
			seen[got.EventID] = true
			require.Equal(t, "shop", got.Source)
			require.Equal(t, w.typ, got.Type)
			require.Equal(t, w.agg, got.AggregateID)
			require.Equal(t, prefix+strings.SplitN(w.typ, ".", 2)[0], got.Topic)
			require.GreaterOrEqual(t, got.Partition, int32(0))
			require.GreaterOrEqual(t, got.Offset, int64(0))
			require.JSONEq(t, w.payload, string(got.Payload))
			require.True(t, bytes.HasPrefix(keys["payload"], []byte(w.payload[:1])), "payload is raw JSON, not a string: %s", line)
		}
	}
	// The default: one line of text per event.
	textLine := regexp.MustCompile(`^event (\d+) (\S+) source=shop aggregate=(\S+) topic=(\S+) partition=\d+ offset=\d+ payload=(.*)$`)
	checkText := func(lines []string) {
		t.Helper()
		require.Len(t, lines, len(want), "one line per event:\n%s", strings.Join(lines, "\n"))
		seen := map[int64]bool{}
		for _, line := range lines {
			m := textLine.FindStringSubmatch(line)
			require.NotNil(t, m, "a text line: %q", line)
			id, err := strconv.ParseInt(m[1], 10, 64)
			require.NoError(t, err)
			w, ok := want[id]
			require.True(t, ok, "unexpected event %d: %s", id, line)
			require.False(t, seen[id], "event %d printed twice", id)
			seen[id] = true
			require.Equal(t, w.typ, m[2])
			require.Equal(t, w.agg.String(), m[3])
			require.Equal(t, prefix+strings.SplitN(w.typ, ".", 2)[0], m[4])
			require.JSONEq(t, w.payload, m[5])
		}
	}

	first := consume("--name", "watcher", "--json")
	require.Eventually(t, func() bool { return len(first.lines()) >= len(want) }, 30*time.Second, 20*time.Millisecond,
		"consume printed %d of %d events", len(first.lines()), len(want))
	require.Eventually(t, func() bool { return caughtUp(t, broker, "watcher", prefix+"order", prefix+"payment") }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, first.stop(), "SIGTERM ends consume cleanly")
	t.Logf("outbox consume --name watcher --json:\n%s", first.stdout.String())
	check(first.lines())
	require.Contains(t, first.stdout.String(), `"note":"<b>&</b> ü"`, "payload printed as is, not HTML-escaped")
	require.EqualValues(t, len(want), processedCount(t, db, "watcher"))
	require.Contains(t, first.stderr.String(), "processed=5 duplicates=0")

	// The same name in a new group: Kafka delivers every record again, and
	// every one is a duplicate.
	again := consume("--name", "watcher", "--group", "watcher-replay")
	require.Eventually(t, func() bool { return caughtUp(t, broker, "watcher-replay", prefix+"order", prefix+"payment") }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, again.stop())
	require.Empty(t, again.stdout.String(), "a name prints each event once")
	require.Contains(t, again.stderr.String(), "processed=0 duplicates=5")
	require.EqualValues(t, len(want), processedCount(t, db, "watcher"))

	// Another name (its own group, by default) prints them all again, as
	// text by default.
	other := consume("--name", "auditor", "--batch-size", "1", "--concurrency", "2")
	require.Eventually(t, func() bool { return len(other.lines()) >= len(want) }, 30*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return caughtUp(t, broker, "auditor", prefix+"order", prefix+"payment") }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, other.stop())
	t.Logf("outbox consume --name auditor:\n%s", other.stdout.String())
	checkText(other.lines())
	require.EqualValues(t, len(want), processedCount(t, db, "auditor"))

	// --quiet prints nothing and still records the events; --http serves
	// the consumer's counters under its name, its lag and readiness.
	quiet := consume("--name", "loadtest", "--quiet", "--http", "127.0.0.1:0")
	require.Eventually(t, func() bool { return processedCount(t, db, "loadtest") == int64(len(want)) }, 30*time.Second, 50*time.Millisecond)
	addr := servedAddr(t, quiet)
	require.Equal(t, "ok\n", httpGet(t, "http://"+addr+"/healthz"))
	require.Eventually(t, func() bool {
		return strings.Contains(httpGet(t, "http://"+addr+"/metrics"), `outbox_consumer_processed_total{consumer="loadtest"} 5`+"\n")
	}, 30*time.Second, 50*time.Millisecond)
	metrics := httpGet(t, "http://"+addr+"/metrics")
	for _, m := range []string{"records_total", "duplicates_total", "dead_letters_total", "malformed_total", "dead_letter_dropped_total", "retries_total"} {
		require.Contains(t, metrics, "outbox_consumer_"+m+`{consumer="loadtest"} `)
	}
	// The group's lag per partition, read from the broker, and /readyz
	// over the database and the broker.
	require.Eventually(t, func() bool {
		return strings.Contains(httpGet(t, "http://"+addr+"/metrics"), `outbox_consumer_lag{consumer="loadtest",`)
	}, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, "database: ok\nbroker: ok\n", httpGet(t, "http://"+addr+"/readyz"))
	require.NoError(t, quiet.stop())
	require.Empty(t, quiet.stdout.String())

	// The deprecated --output json still works, as --json, with a warning.
	legacy := consume("--name", "legacy", "--output", "json")
	require.Eventually(t, func() bool { return len(legacy.lines()) >= len(want) }, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, legacy.stop())
	check(legacy.lines())
	require.Contains(t, legacy.stderr.String(), "--output has been deprecated, use --json or --quiet")
}

// servedAddr is the address a command started with --http 127.0.0.1:0
// logged it serves on.
func servedAddr(t *testing.T, b *background) string {
	t.Helper()
	re := regexp.MustCompile(`msg="serving metrics and health checks" addr=(\S+)`)
	var addr string
	require.Eventually(t, func() bool {
		m := re.FindStringSubmatch(b.stderr.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	}, 30*time.Second, 20*time.Millisecond, "no serving line in:\n%s", b.stderr.String())
	return addr
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", url, body)
	return string(body)
}

// A text line is one line whatever the payload: compacted, cut at 500
// bytes on a rune boundary; odd types are quoted.
func TestConsumeTextLine(t *testing.T) {
	t.Parallel()
	agg := uuid.New()
	var b bytes.Buffer
	writeTextLine(&b, consumer.Event{ID: 7, Type: "order.placed", AggregateID: agg, Topic: "order", Partition: 1, Offset: 2,
		Payload: json.RawMessage("{\n  \"a\": 1\n}")})
	require.Equal(t, "event 7 order.placed aggregate="+agg.String()+" topic=order partition=1 offset=2 payload={\"a\":1}\n", b.String())

	b.Reset()
	long := `"` + strings.Repeat("ü", 400) + `"`
	writeTextLine(&b, consumer.Event{ID: 8, Type: "odd type\n", Source: "s", AggregateID: agg, Topic: "t", Payload: json.RawMessage(long)})
	line := b.String()
	require.Equal(t, 1, strings.Count(line, "\n"))
	require.True(t, strings.HasPrefix(line, `event 8 "odd type\n" source=s `), line)
	require.True(t, utf8.ValidString(line), line)
	require.Contains(t, line, fmt.Sprintf("... (%d bytes; --json prints it whole)", len(long)))
}

// A text line's payload excerpt shows the characters a terminal acts on
// (a C1 control, a bidirectional override) as JSON escapes: the same JSON,
// made visible.
func TestConsumeTextLineEscapesThePayload(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	writeTextLine(&b, consumer.Event{ID: 9, Type: "order.\x1b[31m", AggregateID: uuid.New(), Topic: "order",
		Payload: json.RawMessage("{\"a\": \"\u009b2J\u202eevil\"}")})
	line := b.String()
	for _, c := range []string{"\x1b", "\u009b", "\u202e"} {
		require.NotContains(t, line, c)
	}
	require.Contains(t, line, `event 9 "order.\x1b[31m" `)
	require.Contains(t, line, `payload={"a":"\u009b2J\u202eevil"}`)
}

// failWriter fails every write, as a full disk or a closed file would.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// A failed write to stdout stops consume with an error; the event is not
// recorded as processed (it comes again on the next run) nor dead-lettered.
func TestConsumeStopsWhenStdoutFails(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	broker, err := devkafka.Start(devkafka.Config{Partitions: 1})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	for i := range 3 {
		emit(t, db, uuid.New(), "order.placed", map[string]int{"n": i})
	}
	relay := startCommand(t, db, "relay", "--brokers", broker.Addr(), "--poll-interval", "50ms", "--cleanup-interval", "0")
	require.Eventually(t, func() bool { return count(t, db, "dispatched_at IS NULL") == 0 }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, relay.stop())

	var stderr syncBuffer
	root := NewRoot(failWriter{}, &stderr)
	root.SetArgs([]string{"consume", "--brokers", broker.Addr(), "--topics", "order",
		"--database-url", db.URL, "--schema", db.Tables.Schema})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = root.ExecuteContext(ctx)
	require.Error(t, err, "consume returned on its own")
	require.NoError(t, ctx.Err(), "consume returned on its own, before the deadline")
	require.ErrorContains(t, err, "no space left on device")
	require.ErrorContains(t, err, "comes again on the next run")
	require.Zero(t, processedCount(t, db, ""))
	require.NotContains(t, stderr.String(), "dead-letter")
}

func TestConsumeRejectsBadFlags(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	broker, err := devkafka.Start(devkafka.Config{Partitions: 1})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	bare := pgtest.New(t, pgtest.Options{MaxConns: 2, NoMigrate: true})

	for _, tc := range []struct {
		db   *pgtest.DB
		args []string
		want string
	}{
		{db, []string{"--brokers", broker.Addr()}, "no topics: pass --topics"},
		{db, []string{"--brokers", broker.Addr(), "--topics", " , "}, "no topics: pass --topics"},
		{db, []string{"--brokers", broker.Addr(), "--topics", "order", "--output", "xml"}, `--output "xml": use --json (one JSON line per event) or --quiet`},
		{db, []string{"--brokers", broker.Addr(), "--topics", "order", "--json", "--quiet"}, "--json and --quiet (or --output) contradict each other"},
		{db, []string{"--brokers", broker.Addr(), "--topics", "order", "--output", "none", "--json"}, "--json and --quiet (or --output) contradict each other"},
		{db, []string{"--brokers", broker.Addr(), "--topics", "order", "--http", "9091"}, `--http "9091": write it as host:port`},
		{db, []string{"--brokers", broker.Addr(), "--topics", "order,bad topic"}, `--topics holds topic "bad topic" with the character ' '`},
		{db, []string{"--brokers", broker.Addr(), "--topics", "order", "--batch-size", "-1"}, "--batch-size (-1) and --concurrency (0): use a positive number"},
		{db, []string{"--brokers", "", "--topics", "order"}, "no Kafka brokers: pass --brokers"},
		{db, []string{"--brokers", broker.Addr(), "--topics", "order", "--contracts", "/nonexistent/contracts"}, "--contracts names the directory of the event contracts"},
		{bare, []string{"--brokers", broker.Addr(), "--topics", "order"}, "run `outbox migrate up`"},
	} {
		code, stdout, stderr := runCLI(t, tc.db, append([]string{"consume"}, tc.args...)...)
		require.Equal(t, 1, code, "consume %s: %s", strings.Join(tc.args, " "), stderr)
		require.Contains(t, stderr, tc.want, "consume %s", strings.Join(tc.args, " "))
		// The error is one line; a command that got as far as connecting
		// has logged which database it connected to before it, and
		// --output warns that it is deprecated.
		var errLines []string
		for l := range strings.SplitSeq(strings.TrimSpace(stderr), "\n") {
			if !strings.Contains(l, `msg="connected to Postgres"`) && !strings.HasPrefix(l, "Flag --output has been deprecated") {
				errLines = append(errLines, l)
			}
		}
		require.Len(t, errLines, 1, "one line: %q", stderr)
		require.Empty(t, stdout)
	}
	require.Zero(t, processedCount(t, db, ""), "bad flags wrote to processed_events")

	code, stdout, _ := runCLI(t, db, "consume", "--help")
	require.Equal(t, 0, code)
	for _, s := range []string{"--topics", "--group", "--name", "--json", "--quiet", "--http", "--batch-size", "--concurrency", "--brokers", "--sasl-mechanism", "SIGTERM",
		"processed table", "<topic>.dlq", "not a read-only viewer", "kcat -C"} {
		require.Contains(t, stdout, s)
	}
	require.NotContains(t, stdout, "--output", "deprecated, hidden")
	var out bytes.Buffer
	require.Equal(t, 0, Main([]string{"--help"}, &out, &out))
	stdout = out.String()
	require.Contains(t, stdout, "consume")
}

// A binary payload prints as its content type and hex on a text line, and
// as base64 beside "payload": null with --json.
func TestConsumePrintsBinaryPayloads(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	ev := consumer.Event{ID: 9, Type: "order.placed", AggregateID: uuid.New(), Topic: "order",
		ContentType: "application/x-protobuf", Payload: []byte{0x0a, 0, 0xff}}
	writeTextLine(&b, ev)
	require.Contains(t, b.String(), `payload=(application/x-protobuf) \x0a00ff`+"\n")

	b.Reset()
	p := &eventPrinter{w: &b, format: formatJSON}
	require.NoError(t, p.handle(context.Background(), nil, ev))
	var got map[string]any
	require.NoError(t, json.Unmarshal(b.Bytes(), &got))
	require.Nil(t, got["payload"])
	require.Equal(t, "application/x-protobuf", got["content_type"])
	require.Equal(t, "CgD/", got["payload_base64"])
}
