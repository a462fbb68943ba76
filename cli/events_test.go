package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// insertRow inserts one outbox row by plain SQL, as a producer outside Go
// would, and returns its id.
func insertRow(t *testing.T, db *pgtest.DB, agg uuid.UUID, typ, payload string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), "INSERT INTO "+db.Tables.OutboxIdent()+
		" (aggregate_id, type, payload) VALUES ($1, $2, $3::jsonb) RETURNING id", agg, typ, payload).Scan(&id))
	return id
}

func execSQL(t *testing.T, db *pgtest.DB, sql string, args ...any) {
	t.Helper()
	sql = strings.NewReplacer("{{outbox}}", db.Tables.OutboxIdent(), "{{failures}}", migrate.FailuresIdent(db.Tables),
		"{{parked}}", migrate.ParkedIdent(db.Tables)).Replace(sql)
	_, err := db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err, sql)
}

// dump is the outbox, failures and parked tables as text, to tell whether
// a command changed anything.
func dump(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	var s string
	q := strings.NewReplacer("{{outbox}}", db.Tables.OutboxIdent(), "{{failures}}", migrate.FailuresIdent(db.Tables),
		"{{parked}}", migrate.ParkedIdent(db.Tables)).Replace(`SELECT
  coalesce((SELECT string_agg(t::text, E'\n' ORDER BY id) FROM {{outbox}} t), '') || E'\n--\n' ||
  coalesce((SELECT string_agg(t::text, E'\n' ORDER BY event_id) FROM {{failures}} t), '') || E'\n--\n' ||
  coalesce((SELECT string_agg(t::text, E'\n' ORDER BY id) FROM {{parked}} t), '')`)
	require.NoError(t, db.Pool.QueryRow(context.Background(), q).Scan(&s))
	return s
}

// heldFailure reads a row's failure record: its attempts and whether its
// hold is active.
func heldFailure(t *testing.T, db *pgtest.DB, id int64) (attempts int, active bool, ok bool) {
	t.Helper()
	err := db.Pool.QueryRow(context.Background(), "SELECT attempts, coalesce(held_until > now(), false) FROM "+migrate.FailuresIdent(db.Tables)+
		" WHERE event_id = $1", id).Scan(&attempts, &active)
	if err != nil {
		return 0, false, false
	}
	return attempts, active, true
}

func TestEventsCommands(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	agg := uuid.New()
	head := insertRow(t, db, agg, "order.placed", `{"n": 1, "blob": "`+strings.Repeat("x", 700)+`"}`)
	behind := insertRow(t, db, agg, "order.paid", `{"n": 2}`)
	done := insertRow(t, db, uuid.New(), "order.placed", `{"n": 3}`)
	execSQL(t, db, `UPDATE {{outbox}} SET dispatched_at = now() WHERE id = $1`, done)
	execSQL(t, db, `INSERT INTO {{failures}} (event_id, aggregate_id, type, reason, error, attempts, first_failed_at, failed_at, held_until)
VALUES ($1, $2, 'order.placed', 'too_large', 'MESSAGE_TOO_LARGE: the broker refused it', 3, now(), now(), now() + interval '1 hour')`, head, agg)
	ids := func(id int64) string { return strconv.FormatInt(id, 10) }

	// show: text, with the failure and hold, and the row waited behind.
	code, stdout, stderr := runCLI(t, db, "events", "show", ids(head))
	require.Equal(t, 0, code, stderr)
	t.Logf("outbox events show %d:\n%s", head, stdout)
	for _, re := range []string{
		`(?m)^state\s+pending$`,
		`(?m)^aggregate_id\s+` + agg.String() + `$`,
		`(?m)^dispatched_at\s+pending$`,
		`(?m)^payload\s+\d+ bytes\s+\(record: \d+ bytes`,
		`(?m)^headers\s+-$`,
		`(?m)^failure\s+too_large: MESSAGE_TOO_LARGE: the broker refused it$`,
		`(?m)^attempts\s+3\s+\(first failed `,
		`(?m)^held_until\s+\S+\s+\(active, `,
		`(?m)^payload \(first 500 of \d+ bytes; --payload prints it all\):$`,
	} {
		require.Regexp(t, re, stdout)
	}
	code, stdout, _ = runCLI(t, db, "events", "show", ids(behind))
	require.Equal(t, 0, code)
	require.Regexp(t, `(?m)^waits behind\s+`+ids(head)+`\s`, stdout)
	code, stdout, _ = runCLI(t, db, "events", "show", ids(head), "--payload")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, strings.Repeat("x", 700))

	code, stdout, _ = runCLI(t, db, "events", "show", ids(head), "--json")
	require.Equal(t, 0, code)
	var shown struct {
		ID               int64   `json:"id"`
		State            string  `json:"state"`
		DispatchedAt     *string `json:"dispatched_at"`
		PayloadBytes     int     `json:"payload_bytes"`
		PayloadTruncated bool    `json:"payload_truncated"`
		Failure          *struct {
			Reason     string `json:"reason"`
			Attempts   int    `json:"attempts"`
			HoldActive bool   `json:"hold_active"`
		} `json:"failure"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &shown), stdout)
	require.Equal(t, head, shown.ID)
	require.Equal(t, "pending", shown.State)
	require.Nil(t, shown.DispatchedAt)
	require.True(t, shown.PayloadTruncated)
	require.NotNil(t, shown.Failure)
	require.Equal(t, "too_large", shown.Failure.Reason)
	require.True(t, shown.Failure.HoldActive)

	code, stdout, _ = runCLI(t, db, "events", "show", ids(done))
	require.Equal(t, 0, code)
	require.Regexp(t, `(?m)^state\s+dispatched$`, stdout)

	code, _, stderr = runCLI(t, db, "events", "show", "99999")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "outbox: event 99999 is neither in")
	require.Contains(t, stderr, "retention cleanup")
	code, _, stderr = runCLI(t, db, "events", "show", "abc")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `event id "abc": use the row's id`)

	// retry: a dry run changes nothing; --yes lifts the hold only.
	before := dump(t, db)
	code, stdout, stderr = runCLI(t, db, "events", "retry", ids(head))
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "would lift 1 hold(s)")
	require.Contains(t, stdout, "dry run: nothing changed; add --yes")
	require.Equal(t, before, dump(t, db))

	code, stdout, _ = runCLI(t, db, "events", "retry", ids(behind))
	require.Equal(t, 0, code)
	require.Contains(t, stdout, fmt.Sprintf("event %d is pending and not held", behind))
	require.Contains(t, stdout, fmt.Sprintf("to retry that one: outbox events retry %d", head))

	code, stdout, stderr = runCLI(t, db, "events", "retry", ids(head), "--yes")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "lifted 1 hold(s)")
	require.Regexp(t, `level=INFO msg="lifted holds on outbox events.*verb=retry event_ids=\[`+ids(head)+`\]`, stderr)
	attempts, active, ok := heldFailure(t, db, head)
	require.True(t, ok)
	require.False(t, active)
	require.Equal(t, 3, attempts)

	code, stdout, _ = runCLI(t, db, "events", "retry", "--aggregate", agg.String(), "--yes")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "has no active hold on a pending event: nothing to do")

	code, _, stderr = runCLI(t, db, "events", "retry", ids(done), "--yes")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, fmt.Sprintf("outbox events replay --from-id %d --to-id %d", done, done))
	code, _, stderr = runCLI(t, db, "events", "retry")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "retry needs an event id or --aggregate")

	// park: the reason is required; a dry run changes nothing; --yes moves
	// the row and says the aggregate's order is broken.
	code, _, stderr = runCLI(t, db, "events", "park", ids(head))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `park needs --reason`)
	before = dump(t, db)
	code, stdout, stderr = runCLI(t, db, "events", "park", ids(head), "--reason", "poison: OPS-7")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, fmt.Sprintf(`would park event %d`, head))
	require.Contains(t, stdout, "1 later pending event(s) would be published without it, and so are those emitted later: a deliberate break")
	require.Contains(t, stdout, "dry run: nothing changed")
	require.Equal(t, before, dump(t, db))
	code, stdout, stderr = runCLI(t, db, "events", "park", ids(head), "--reason", "poison: OPS-7", "--yes")
	require.Equal(t, 0, code, stderr)
	t.Logf("outbox events park %d --yes:\n%s", head, stdout)
	require.Contains(t, stdout, fmt.Sprintf(`parked event %d`, head))
	require.Contains(t, stdout, "last error: MESSAGE_TOO_LARGE: the broker refused it")
	require.Contains(t, stderr, "verb=park event_id="+ids(head))
	require.Zero(t, count(t, db, "id = "+ids(head)))
	code, stdout, _ = runCLI(t, db, "events", "show", ids(head))
	require.Equal(t, 0, code)
	require.Regexp(t, `(?m)^state\s+parked$`, stdout)
	require.Regexp(t, `(?m)^parked reason\s+poison: OPS-7$`, stdout)

	code, _, stderr = runCLI(t, db, "events", "park", ids(head), "--reason", "again", "--yes")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "is already parked")
	code, _, stderr = runCLI(t, db, "events", "park", ids(done), "--reason", "x", "--yes")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "cannot be parked")

	// unpark.
	before = dump(t, db)
	code, stdout, _ = runCLI(t, db, "events", "unpark", ids(head))
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "out of its original order")
	require.Contains(t, stdout, "dry run: nothing changed")
	require.Equal(t, before, dump(t, db))
	code, stdout, stderr = runCLI(t, db, "events", "unpark", ids(head), "--yes")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, fmt.Sprintf("unparked event %d", head))
	require.Contains(t, stderr, "verb=unpark event_id="+ids(head))
	require.Equal(t, int64(1), count(t, db, "dispatched_at IS NULL AND id = "+ids(head)))
	code, _, stderr = runCLI(t, db, "events", "unpark", ids(head), "--yes")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "is not parked")

	// replay.
	code, _, stderr = runCLI(t, db, "events", "replay", "--from-id", "5", "--to-id", "4")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "the range is inverted")
	code, _, stderr = runCLI(t, db, "events", "replay", "--to-id", "4")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "replay needs a range")
	before = dump(t, db)
	code, stdout, _ = runCLI(t, db, "events", "replay", "--from-id", "1", "--to-id", ids(done))
	require.Equal(t, 0, code)
	require.Contains(t, stdout, fmt.Sprintf("would replay 1 dispatched event(s) in ids 1 to %d (id %d)", done, done))
	require.Contains(t, stdout, "2 event(s) in the range are pending already")
	require.Equal(t, before, dump(t, db))
	code, stdout, stderr = runCLI(t, db, "events", "replay", "--from-id", "1", "--to-id", ids(done), "--type", "order.placed", "--yes")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "replayed 1 dispatched event(s) in ids 1 to "+ids(done)+" (type order.placed)")
	require.Contains(t, stderr, "verb=replay from_id=1 to_id="+ids(done))
	require.Zero(t, count(t, db, "dispatched_at IS NOT NULL"))
	code, stdout, _ = runCLI(t, db, "events", "replay", "--from-id", "1", "--to-id", ids(done), "--yes")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "nothing to replay")
}

// replay says what it does: each row keeps its created_at and gets
// requeued_at, and the range is named once, with the ids found only
// when they are not its ends.
func TestReplaySaysCreatedAtIsKept(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	first := insertRow(t, db, uuid.New(), "order.placed", `{}`)
	last := insertRow(t, db, uuid.New(), "order.placed", `{}`)
	execSQL(t, db, `UPDATE {{outbox}} SET dispatched_at = now(), created_at = now() - interval '1 day'`)
	var created time.Time
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT created_at FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", first).Scan(&created))
	from, to := strconv.FormatInt(first, 10), strconv.FormatInt(last, 10)
	rng := fmt.Sprintf("in ids %d to %d", first, last)

	for _, yes := range []bool{false, true} {
		args := []string{"events", "replay", "--from-id", from, "--to-id", to}
		if yes {
			args = append(args, "--yes")
		}
		code, stdout, stderr := runCLI(t, db, args...)
		require.Equal(t, 0, code, stderr)
		head, _, _ := strings.Cut(stdout, "\n")
		t.Log(head)
		require.Contains(t, head, "2 dispatched event(s) "+rng+",")
		require.Equal(t, 1, strings.Count(stdout, fmt.Sprintf("ids %d to %d", first, last)), "the range is named once")
		require.Contains(t, head, "created_at kept and requeued_at = now()")
		require.NotContains(t, stdout, "created_at = now()")
		require.NotContains(t, stdout, "lost")
	}
	var kept time.Time
	var requeued *time.Time
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT created_at, requeued_at FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", first).Scan(&kept, &requeued))
	require.True(t, created.Equal(kept), "created_at is kept, as replay says")
	require.NotNil(t, requeued)
}

// The default of --database-url, shown in every command's help, never
// carries the password of DATABASE_URL; commands still use DATABASE_URL
// when the flag is absent. (Not parallel: it sets the environment.)
func TestDatabaseURLPasswordNotInHelp(t *testing.T) {
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	t.Setenv("DATABASE_URL", "postgres://u:s3cret@h/db")
	for _, args := range [][]string{{"relay", "--help"}, {"--help"}, {"events", "show", "--help"}, {"stats", "-h"}} {
		var out, errOut bytes.Buffer
		require.Equal(t, 0, Main(args, &out, &errOut), errOut.String())
		require.NotContains(t, out.String()+errOut.String(), "s3cret", args)
		if args[0] == "relay" {
			require.Contains(t, out.String(), "env DATABASE_URL")
		}
	}

	// The flag absent, the environment is used; the flag present wins.
	t.Setenv("DATABASE_URL", db.URL)
	var out, errOut bytes.Buffer
	require.Equal(t, 0, Main([]string{"migrate", "status", "--schema", db.Tables.Schema}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), db.Tables.OutboxIdent())
	out.Reset()
	errOut.Reset()
	require.Equal(t, 1, Main([]string{"migrate", "status", "--schema", db.Tables.Schema, "--database-url", "postgres://nobody@127.0.0.1:1/x?connect_timeout=2"}, &out, &errOut))
	require.Contains(t, errOut.String(), "cannot reach Postgres at 127.0.0.1:1/x as nobody")
}

// `outbox dev-kafka --max-message-bytes N` starts a broker that refuses
// records larger than N.
func TestDevKafkaMaxMessageBytes(t *testing.T) {
	t.Parallel()
	var stdout, stderr syncBuffer
	root := NewRoot(&stdout, &stderr)
	root.SetArgs([]string{"dev-kafka", "--listen", "127.0.0.1:0", "--max-message-bytes", "1000"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("dev-kafka did not stop")
		}
	})
	addrRe := regexp.MustCompile(`listening on (\S+) \(partitions per new topic: 6, message.max.bytes: 1000\)`)
	require.Eventually(t, func() bool { return addrRe.MatchString(stdout.String()) }, 10*time.Second, 10*time.Millisecond, "stdout: %s", stdout.String())
	addr := addrRe.FindStringSubmatch(stdout.String())[1]

	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.AllowAutoTopicCreation(), kgo.RecordDeliveryTimeout(10*time.Second))
	require.NoError(t, err)
	defer cl.Close()
	pctx, pcancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer pcancel()
	large := make([]byte, 2000) // random: the client compresses
	_, _ = rand.Read(large)
	err = cl.ProduceSync(pctx, &kgo.Record{Topic: "limits", Value: large}).FirstErr()
	require.True(t, errors.Is(err, kerr.MessageTooLarge), "a 2000-byte record: %v", err)
	require.NoError(t, cl.ProduceSync(pctx, &kgo.Record{Topic: "limits", Value: bytes.Repeat([]byte("x"), 500)}).FirstErr())

	code, _, errOut := outboxMain(t, "dev-kafka", "--max-message-bytes", "-1")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "--max-message-bytes -1: use a positive size")
}

func outboxMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Main(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// The verbs against two running relayers on a broker that refuses records
// over 100,000 bytes. One aggregate's first row is 150 kB: it is held
// (recorded in the failures table, every relayer skipping its aggregate),
// the aggregate's 3 later rows wait behind it, the other aggregates flow.
// park lets the 3 through, in order; unpark puts it back and it is held
// again; retry lifts the hold and a relayer tries it again at once; replay
// publishes a range a second time under the same event ids.
func TestEventsVerbsWithRunningRelayers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	broker, err := devkafka.Start(devkafka.Config{Partitions: 3, MaxMessageBytes: 100_000})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	const topic = "evverbs"

	agg := uuid.New()
	blob := make([]byte, 75_000)
	_, _ = rand.Read(blob)
	big := insertRow(t, db, agg, topic+".big", `{"blob": "`+hex.EncodeToString(blob)+`"}`)
	var small []int64
	for i := range 3 {
		small = append(small, insertRow(t, db, agg, topic+".small", fmt.Sprintf(`{"n": %d}`, i)))
	}
	var others []int64
	for i := range 20 {
		others = append(others, insertRow(t, db, uuid.New(), topic+".other", fmt.Sprintf(`{"n": %d}`, i)))
	}

	for range 2 {
		client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{broker.Addr()},
			Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}})
		require.NoError(t, err)
		t.Cleanup(client.Close)
		r, err := relay.New(relay.Config{
			Common:       relay.Common{Pool: db.Pool, Sink: kafkapub.NewPublisher(client, kafkapub.PublisherConfig{}), Tables: db.Tables, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Logger: testLogger(t)},
			PollInterval: 100 * time.Millisecond, HoldOut: time.Minute,
		})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		stopped := make(chan error, 1)
		go func() { stopped <- r.Run(rctx) }()
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-stopped:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("relayer did not stop within 30s")
			}
		})
	}

	// deliveries reads the topic until done, and returns the event ids
	// delivered per key, in offset order.
	deliveries := func(what string, done func(byKey map[string][]int64) bool) map[string][]int64 {
		t.Helper()
		var byKey map[string][]int64
		kafkatest.Read(t, broker.Addr(), 30*time.Second, func(rs []*kgo.Record) bool {
			byKey = map[string][]int64{}
			for _, r := range rs { // one key lives in one partition, read in offset order
				byKey[string(r.Key)] = append(byKey[string(r.Key)], kafkatest.EventID(r))
			}
			return done(byKey)
		}, topic)
		t.Logf("%s: %d keys on the broker", what, len(byKey))
		return byKey
	}
	othersIn := func(byKey map[string][]int64, times int) bool {
		n := map[int64]int{}
		for _, ids := range byKey {
			for _, id := range ids {
				n[id]++
			}
		}
		for _, id := range others {
			if n[id] < times {
				return false
			}
		}
		return true
	}

	// The 20 others flow; the big row is held, with its reason.
	deliveries("others", func(b map[string][]int64) bool { return othersIn(b, 1) })
	require.Eventually(t, func() bool { _, active, _ := heldFailure(t, db, big); return active }, 30*time.Second, 50*time.Millisecond,
		"no relayer recorded an active hold for the 150 kB row")
	code, stdout, stderr := runCLI(t, db, "events", "show", strconv.FormatInt(big, 10))
	require.Equal(t, 0, code, stderr)
	t.Logf("outbox events show %d:\n%s", big, stdout[:min(len(stdout), 2000)])
	require.Regexp(t, `(?m)^failure\s+too_large: `, stdout)
	require.Regexp(t, `(?m)^held_until\s+\S+\s+\(active`, stdout)
	require.Equal(t, int64(4), count(t, db, "dispatched_at IS NULL"), "the big row and the 3 behind it wait")

	// Park it: the 3 small rows of its aggregate go out, in order.
	code, stdout, stderr = runCLI(t, db, "events", "park", strconv.FormatInt(big, 10), "--reason", "test", "--yes")
	require.Equal(t, 0, code, stderr)
	t.Logf("outbox events park --yes:\n%s", stdout)
	byKey := deliveries("after park", func(b map[string][]int64) bool { return len(b[agg.String()]) >= 3 })
	require.Equal(t, small, firstDeliveries(byKey[agg.String()]), "the aggregate's rows arrive in order, without the parked one")
	require.Eventually(t, func() bool { return count(t, db, "dispatched_at IS NULL") == 0 }, 10*time.Second, 50*time.Millisecond)

	// Unpark it: it is tried again, and held again.
	code, stdout, stderr = runCLI(t, db, "events", "unpark", strconv.FormatInt(big, 10), "--yes")
	require.Equal(t, 0, code, stderr)
	t.Logf("outbox events unpark --yes:\n%s", stdout)
	var attempts int
	require.Eventually(t, func() bool {
		var active bool
		attempts, active, _ = heldFailure(t, db, big)
		return active
	}, 30*time.Second, 50*time.Millisecond, "the unparked row was not held again")

	// Retry: the hold is lifted, a relayer tries at once (the hold-out is a
	// minute) and holds it again, one attempt more.
	code, stdout, stderr = runCLI(t, db, "events", "retry", strconv.FormatInt(big, 10), "--yes")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "lifted 1 hold(s)")
	require.Eventually(t, func() bool {
		n, active, _ := heldFailure(t, db, big)
		return active && n > attempts
	}, 10*time.Second, 50*time.Millisecond, "no relayer retried the row after its hold was lifted")

	// Replay the others: each arrives a second time under its event id.
	code, stdout, stderr = runCLI(t, db, "events", "replay", "--from-id", strconv.FormatInt(others[0], 10),
		"--to-id", strconv.FormatInt(others[len(others)-1], 10), "--yes")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "replayed 20 dispatched event(s)")
	deliveries("after replay", func(b map[string][]int64) bool { return othersIn(b, 2) })
	require.Eventually(t, func() bool { return count(t, db, "dispatched_at IS NULL") == 1 }, 10*time.Second, 50*time.Millisecond,
		"only the held row is left pending")
}

// firstDeliveries drops repeated ids (at-least-once re-sends), keeping the
// order of first arrival.
func firstDeliveries(ids []int64) []int64 {
	seen := map[int64]bool{}
	var out []int64
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}
