package cli

// Tests of the operations commands (watchdog, cleanup, stats) and of the
// relay's operations wiring (relayops.go). They are in package cli to
// drive relayOps directly: `outbox relay` itself runs until a signal.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// runCLI runs `outbox args...` against db's schema and returns the exit
// code and output.
func runCLI(t *testing.T, db *pgtest.DB, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append(args, "--database-url", db.URL, "--schema", db.Tables.Schema)
	code = Main(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func emit(t *testing.T, db *pgtest.DB, agg uuid.UUID, typ string, payload any) int64 {
	t.Helper()
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	var id int64
	require.NoError(t, pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		id, err = p.Emit(context.Background(), tx, outbox.Event{AggregateID: agg, Type: typ, Payload: payload})
		return err
	}))
	return id
}

func count(t *testing.T, db *pgtest.DB, where string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Tables.OutboxIdent()+" WHERE "+where).Scan(&n))
	return n
}

// startRelay runs a relayer with the relay command's operations wiring,
// configured by relay flags, until the test ends.
func startRelay(t *testing.T, db *pgtest.DB, broker *devkafka.Broker, mod func(*relay.Config), flags ...string) *relayOps {
	t.Helper()
	var o relayOps
	fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
	o.register(fs)
	require.NoError(t, fs.Parse(flags))

	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{broker.Addr()}})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	cfg := relay.Config{
		Common:       relay.Common{Pool: db.Pool, Sink: kafkapub.NewPublisher(client, kafkapub.PublisherConfig{}), Tables: db.Tables, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Logger: testLogger(t)},
		PollInterval: 50 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	require.NoError(t, o.instrument(&cfg))
	r, err := relay.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	stopOps, err := o.start(ctx, r)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("relayer did not stop within 30s")
		}
		stopOps()
	})
	return &o
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// Must-show 3: a poison row (payload over the relay's limit, forced in by
// raw SQL) sits among healthy rows. The healthy rows flow, later ones and
// other aggregates' included; the poison row's aggregate waits; `outbox
// watchdog` exits 1 and names the stuck row with the error the relay
// recorded, and the row behind it. Once the row is deleted (the runbook),
// its aggregate flows and the watchdog exits 0.
func TestWatchdogNamesPoisonRow(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	broker, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(broker.Close)

	poisoned := uuid.New()
	for i := range 20 {
		emit(t, db, uuid.New(), "order.placed", map[string]int{"n": i})
	}
	// A row written by plain INSERT before migration 6, whose guard now
	// refuses it.
	var poison int64
	db.WriteLegacy(t, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+
			` (aggregate_id, type, payload, headers) VALUES ($1, 'order.placed', '{}', '{"retries": 3}') RETURNING id`, poisoned).Scan(&poison)
	})
	follower := emit(t, db, poisoned, "order.paid", map[string]int{"n": 1})
	for i := range 20 {
		emit(t, db, uuid.New(), "payment.captured", map[string]int{"n": i})
	}

	o := startRelay(t, db, broker, func(c *relay.Config) {
		c.HoldOut = 500 * time.Millisecond
	}, "--http", "127.0.0.1:0", "--metrics-refresh", "100ms", "--stuck-after", "1s", "--watchdog-interval", "200ms", "--cleanup-interval", "0")
	require.Eventually(t, func() bool { return count(t, db, "dispatched_at IS NULL") == 2 }, 20*time.Second, 20*time.Millisecond,
		"the 40 healthy rows did not flow past the poison row")
	require.Equal(t, int64(2), count(t, db, fmt.Sprintf("dispatched_at IS NULL AND id IN (%d, %d)", poison, follower)))

	var stdout, stderr string
	require.Eventually(t, func() bool {
		var code int
		code, stdout, stderr = runCLI(t, db, "watchdog", "--stuck-after", "1s")
		return code == 1 && strings.Contains(stdout, "not a JSON object of string values") && strings.Contains(stdout, "2 stuck")
	}, 20*time.Second, 200*time.Millisecond, "watchdog never reported the stuck row with its error")
	t.Logf("outbox watchdog --stuck-after 1s:\n%s%s", stdout, stderr)
	require.Contains(t, stdout, "2 stuck (pending > 1s, or held, or behind a held row), 1 held (undecodable 1; the oldest for")
	require.Regexp(t, regexp.MustCompile(`(?m)^`+strconv.FormatInt(poison, 10)+`\s+`+poisoned.String()+`\s+order\.placed\s+\S+\s+-\s+undecodable\s+\d+\s+(in \S+|due)\s+permanent: headers \{"retries": 3\} are not a JSON object of string values`), stdout)
	require.Regexp(t, regexp.MustCompile(`(?m)^`+strconv.FormatInt(follower, 10)+`\s+`+poisoned.String()+`\s+order\.paid\s+\S+\s+`+strconv.FormatInt(poison, 10)+`\s+-\s+-\s+-\s+-$`), stdout)
	require.Contains(t, stderr, "outbox: unhealthy: 2 row(s) stuck (1 held; the rest wait behind them or were pending longer than 1s)")

	code, stdout, _ := runCLI(t, db, "watchdog", "--stuck-after", "1s", "--json")
	require.Equal(t, 1, code)
	var rep struct {
		Healthy   bool  `json:"healthy"`
		Stuck     int64 `json:"stuck"`
		StuckRows []struct {
			ID        int64   `json:"id"`
			BlockedBy *int64  `json:"blocked_by"`
			LastError *string `json:"last_error"`
			Attempts  int     `json:"attempts"`
		} `json:"stuck_rows"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	require.False(t, rep.Healthy)
	require.Equal(t, int64(2), rep.Stuck)
	require.Len(t, rep.StuckRows, 2)
	require.Equal(t, poison, rep.StuckRows[0].ID)
	require.NotNil(t, rep.StuckRows[0].LastError)
	require.Contains(t, *rep.StuckRows[0].LastError, "not a JSON object of string values")
	require.Positive(t, rep.StuckRows[0].Attempts)
	require.Equal(t, follower, rep.StuckRows[1].ID)
	require.Equal(t, poison, *rep.StuckRows[1].BlockedBy)

	// The relay's own endpoints say the same.
	base := "http://" + o.addr.String()
	code, body := get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.Eventually(t, func() bool {
		_, body := get(t, base+"/metrics")
		return strings.Contains(body, "\noutbox_stuck_events 2\n") && strings.Contains(body, `outbox_publish_errors_total{code="rejected_by_relay",kind="permanent"}`)
	}, 10*time.Second, 50*time.Millisecond, "/metrics does not show the stuck rows")

	// The runbook: delete the poison row; its aggregate flows again.
	_, err = db.Pool.Exec(context.Background(), "DELETE FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", poison)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		code, stdout, _ = runCLI(t, db, "watchdog", "--stuck-after", "1s")
		return code == 0 && strings.Contains(stdout, ": 0 pending,")
	}, 20*time.Second, 200*time.Millisecond, "watchdog did not turn healthy, with nothing pending, once the poison row was gone")
	require.Contains(t, stdout, ": 0 pending,")
	require.Zero(t, count(t, db, "dispatched_at IS NULL"))
}

func TestWatchdogHealthyAndUnmigrated(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	code, stdout, stderr := runCLI(t, db, "watchdog")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, ": 0 pending, oldest 0s (lag SLO 5s: ok), 0 stuck (pending > 5m0s, or held, or behind a held row), 0 held")
	code, stdout, _ = runCLI(t, db, "watchdog", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, `"healthy": true`)

	// A lagging (not yet stuck) outbox breaks the SLO alone.
	_, err := db.Pool.Exec(context.Background(), "INSERT INTO "+db.Tables.OutboxIdent()+
		" (aggregate_id, type, payload, created_at) VALUES (gen_random_uuid(), 'order.placed', '{}', now() - interval '30 seconds')")
	require.NoError(t, err)
	code, _, stderr = runCLI(t, db, "watchdog")
	require.Equal(t, 1, code)
	require.Regexp(t, `outbox: unhealthy: lag 30(\.\d)?s is over the 5s SLO`, stderr)

	bare := pgtest.New(t, pgtest.Options{MaxConns: 2, NoMigrate: true})
	code, _, stderr = runCLI(t, bare, "watchdog")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "run `outbox migrate up`")

	code, _, stderr = runCLI(t, db, "watchdog", "--stuck-after", "0s")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "must be positive durations")
}

// Must-show 4: `outbox cleanup` on 1,000,000 old dispatched rows with
// 10,000 old pending rows among them (and recent rows after) deletes
// exactly the old dispatched rows, in batches, and leaves every pending
// and recent row. -short runs it on a tenth of the rows.
func TestCleanupCommandMillionRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	dispatched, pendingRows := 1_000_000, 10_000
	if testing.Short() {
		dispatched, pendingRows = 100_000, 1_000
	}
	every := dispatched/pendingRows + 1 // every 101st row is pending
	start := time.Now()
	_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Tables.OutboxIdent()+` (aggregate_id, type, payload, created_at, dispatched_at)
SELECT gen_random_uuid(), 'order.placed', '{"n": 1}', now() - interval '30 days',
  CASE WHEN i % $2 = 0 THEN NULL ELSE now() - interval '30 days' END
FROM generate_series(1, $1) AS i`, dispatched+pendingRows, every)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO `+db.Tables.OutboxIdent()+` (aggregate_id, type, payload, created_at, dispatched_at)
SELECT gen_random_uuid(), 'order.placed', '{"n": 2}', now() - interval '1 hour', CASE WHEN i % 10 = 0 THEN NULL ELSE now() - interval '1 hour' END
FROM generate_series(1, 5000) AS i`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "ANALYZE "+db.Tables.OutboxIdent())
	require.NoError(t, err)
	require.Equal(t, int64(dispatched), count(t, db, "dispatched_at < now() - interval '7 days'"))
	require.Equal(t, int64(pendingRows+500), count(t, db, "dispatched_at IS NULL"))
	t.Logf("preloaded %d rows in %s", dispatched+pendingRows+5000, time.Since(start).Round(time.Millisecond))

	code, stdout, stderr := runCLI(t, db, "cleanup", "--retention", "168h", "--batch", "10000", "--pause", "10ms")
	require.Equal(t, 0, code, stderr)
	t.Logf("outbox cleanup --retention 168h --batch 10000 --pause 10ms:\n%s", stdout)
	m := regexp.MustCompile(`deleted (\d+) dispatched rows older than 7d \(dispatched before \S+\) in (\d+) batches, (\S+)`).FindStringSubmatch(stdout)
	require.NotNil(t, m, stdout)
	require.Equal(t, strconv.Itoa(dispatched), m[1])
	batches, _ := strconv.Atoi(m[2])
	// Windows of 10,000 rows over the old rows, and one that reaches the
	// first recent row and stops the walk.
	require.Equal(t, (dispatched+pendingRows)/10_000+1, batches)

	require.Equal(t, int64(pendingRows+500), count(t, db, "dispatched_at IS NULL"), "pending rows were deleted")
	require.Equal(t, int64(pendingRows), count(t, db, "created_at < now() - interval '7 days'"), "only the old pending rows are left of the old rows")
	require.Equal(t, int64(4500), count(t, db, "dispatched_at IS NOT NULL"), "recent dispatched rows were deleted")
	require.Contains(t, stdout, `processed_events": deleted 0 rows older than 30d`)

	// Nothing left to do: one window, nothing deleted.
	code, stdout, stderr = runCLI(t, db, "cleanup", "--processed-retention", "0")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "deleted 0 dispatched rows")
	require.Contains(t, stdout, "left alone (--processed-retention 0)")
}

func TestCleanupCommandRejectsBadFlags(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2, NoMigrate: true})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--retention", "0s"}, "--retention 0s: use a positive duration, e.g. 7d"},
		{[]string{"--batch", "0"}, "--batch 0: use 1 to 1000000 rows per statement"},
		{[]string{"--processed-retention", "-1h"}, "or 0 to leave processed_events alone"},
		{[]string{"--pause", "-1s"}, "--pause -1s"},
	} {
		code, _, stderr := runCLI(t, db, append([]string{"cleanup"}, tc.args...)...)
		require.Equal(t, 1, code)
		require.Contains(t, stderr, tc.want)
	}
}

// A retention under a minute (a mistyped unit: 1ns) would delete every
// dispatched row, or every dedupe row, at once: cleanup and the relay's
// cleanup job refuse it unless --allow-short-retention says it is meant.
func TestCleanupRefusesAShortRetention(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	emit(t, db, uuid.New(), "order.placed", map[string]int{"n": 1})
	_, err := db.Pool.Exec(context.Background(), "UPDATE "+db.Tables.OutboxIdent()+" SET dispatched_at = now() - interval '1 second'")
	require.NoError(t, err)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cleanup", "--retention", "1ns"}, "--retention 1ns is under 1m: it deletes every dispatched row older than that at once; use e.g. 7d, or add --allow-short-retention if you mean it"},
		{[]string{"cleanup", "--processed-retention", "30s"}, "--processed-retention 30s is under 1m"},
		{[]string{"relay", "--brokers", "127.0.0.1:1", "--retention", "1ns"}, "--retention 1ns is under 1m"},
	} {
		code, _, stderr := runCLI(t, db, tc.args...)
		require.Equal(t, 1, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, tc.args)
		require.Equal(t, int64(1), count(t, db, "true"), "%v deleted nothing", tc.args)
	}

	code, stdout, stderr := runCLI(t, db, "cleanup", "--retention", "1ns", "--allow-short-retention")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "deleted 1 dispatched rows older than 1ns")
	require.Zero(t, count(t, db, "true"))
}

func TestStatsCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Tables.OutboxIdent()+` (aggregate_id, type, payload, created_at, dispatched_at) VALUES
  (gen_random_uuid(), 'order.placed', '{}', now() - interval '20 minutes', now() - interval '10 minutes'),
  (gen_random_uuid(), 'order.placed', '{}', now() - interval '10 minutes', NULL),
  (gen_random_uuid(), 'order.placed', '{}', now() - interval '1 minute', now() - interval '10 seconds'),
  (gen_random_uuid(), 'order.placed', '{}', now(), NULL)`)
	require.NoError(t, err)
	// The young pending row is held: a relayer recorded a permanent failure.
	_, err = db.Pool.Exec(ctx, `INSERT INTO `+migrate.FailuresIdent(db.Tables)+` (event_id, aggregate_id, type, reason, error, first_failed_at, failed_at, held_until)
  SELECT id, aggregate_id, type, 'too_large', 'permanent: too large', now(), now(), now() + interval '1 minute' FROM `+db.Tables.OutboxIdent()+`
  WHERE dispatched_at IS NULL ORDER BY id DESC LIMIT 1`)
	require.NoError(t, err)

	code, stdout, stderr := runCLI(t, db, "stats")
	require.Equal(t, 0, code, stderr)
	t.Logf("outbox stats:\n%s", stdout)
	for _, line := range []string{
		`(?m)^pending\s+2$`,
		`(?m)^oldest pending age\s+10m\d+s\s+\(the lag\)$`,
		`(?m)^stuck \(pending > 5m0s, or held\)\s+2\s+\(held rows`,
		`(?m)^held\s+1\s+\(too_large 1; the oldest for \d+(ms|s)\)$`,
		`(?m)^dispatched last minute\s+1\s+\(0\.0/s\)$`,
		`(?m)^dispatched last hour\s+2\s+\(0\.0/s\)$`,
		`(?m)^table size\s+\d+\.\d [KM]iB\s+\(with indexes and TOAST\)$`,
		`(?m)^live / dead rows\s+\d+ / \d+\s+\(\d+\.\d% dead\)$`,
		`(?m)^last vacuum\s+`,
	} {
		require.Regexp(t, line, stdout)
	}

	code, stdout, stderr = runCLI(t, db, "stats", "--json", "--stuck-after", "15m")
	require.Equal(t, 0, code, stderr)
	var s map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &s), stdout)
	require.Equal(t, float64(2), s["pending"])
	require.Equal(t, float64(1), s["stuck"], "the held row, young as it is")
	require.Equal(t, float64(1), s["held"])
	require.Equal(t, map[string]any{"too_large": float64(1)}, s["held_by_reason"])
	require.Equal(t, float64(900), s["stuck_after_seconds"])
	require.InDelta(t, 600, s["oldest_pending_age_seconds"], 30)
	require.Equal(t, float64(1), s["dispatched_last_minute"])
	require.Equal(t, float64(2), s["dispatched_last_hour"])
	require.Positive(t, s["table_bytes"])
	require.Contains(t, s, "dead_rows")
	require.Contains(t, s, "last_autovacuum")
}

func TestRelayOpsFlags(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		":9090":          "127.0.0.1:9090",
		"127.0.0.1:0":    "127.0.0.1:0",
		"0.0.0.0:9090":   "0.0.0.0:9090",
		"[::1]:9090":     "[::1]:9090",
		"localhost:9090": "localhost:9090",
	} {
		got, err := loopbackDefault(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got)
	}
	_, err := loopbackDefault("9090")
	require.ErrorContains(t, err, `--http "9090": write it as host:port, e.g. 127.0.0.1:9090`)
	_, err = loopbackDefault("127.0.0.1:http")
	require.ErrorContains(t, err, "is not a port number")

	var o relayOps
	fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
	o.register(fs)
	require.NoError(t, fs.Parse([]string{"--max-lag", "0s"}))
	err = o.instrument(&relay.Config{Common: relay.Common{Tables: outbox.Tables{}}})
	require.ErrorContains(t, err, "--max-lag 0s: use a positive duration")
}
