package relay_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// batchMemoryChild, when set, makes TestMaxBatchBytesBoundsMemoryAsSent
// the relaying process its parent measures; the value is a
// batchMemoryJob in JSON.
const batchMemoryChild = "OUTBOX_TEST_BATCH_MEMORY_CHILD"

type batchMemoryJob struct {
	URL, Schema, Broker string
	Budget              int
}

// batchMemoryReport is what the relaying process measured, on its last
// line of output.
type batchMemoryReport struct {
	// HeapIdle is the live heap before the relayer ran; HeapHeld the
	// largest live heap while a batch was held (at Publish, after a
	// collection).
	HeapIdle, HeapHeld uint64
	// RSSIdle is the resident set before the relayer ran, RSSPeak the
	// process's peak (VmHWM) once every row was settled.
	RSSIdle, RSSPeak int64
	MostClaimed      int
	Batches          int
}

// MaxBatchBytes bounds what a batch holds by the bytes the relayer
// holds: payloads as it receives and publishes them, not as Postgres
// stores them. 30 rows of 10 MB of repetitive JSON store in about 110 kB
// each (TOAST compresses them), 3.4 MB in all, under the 4 MiB budget;
// counted as stored they made one batch of 300 MB. Counted as sent, each
// row is larger than the budget and goes alone. The broker keeps its
// default limit (1 MiB), so each row is refused as too large and held:
// what is measured is the relayer claiming and holding them. The
// relaying process runs apart (this test binary again) so that its
// memory is its own; it measures its live heap inside Publish, while the
// batch is held, after a collection: the Go heap's size at other times
// follows the collector's pacing (up to twice the live heap), not what
// the relayer holds.
func TestMaxBatchBytesBoundsMemoryAsSent(t *testing.T) {
	if job := os.Getenv(batchMemoryChild); job != "" {
		runBatchMemoryChild(t, job)
		return
	}
	t.Parallel()
	if testing.Short() {
		t.Skip("claims 300 MB of payloads")
	}
	const (
		events = 30
		budget = relay.DefaultMaxBatchBytes
	)
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	broker, err := devkafka.Start(devkafka.Config{Partitions: 1})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	ctx := context.Background()
	// One aggregate per row, so that a held row holds back no other.
	_, err = db.Pool.Exec(ctx, `INSERT INTO `+db.Tables.OutboxIdent()+` (aggregate_id, type, payload)
		SELECT md5($2 || g::text)::uuid, 'order.placed', jsonb_build_object('n', g, 'blob', repeat('abcdefghij', 1000000))
		FROM generate_series(1, $1) g ORDER BY g`, events, db.Tables.Schema)
	require.NoError(t, err)
	var stored, sent int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT sum(pg_column_size(payload)), sum(octet_length(payload::text)) FROM "+db.Tables.OutboxIdent()).Scan(&stored, &sent))
	t.Logf("%d payloads: %d bytes as stored, %d as sent", events, stored, sent)
	require.Less(t, stored, int64(budget), "the rows together must store in less than the budget")

	job, err := json.Marshal(batchMemoryJob{URL: db.URL, Schema: db.Tables.Schema, Broker: broker.Addr(), Budget: budget})
	require.NoError(t, err)
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, os.Args[0], "-test.run=^TestMaxBatchBytesBoundsMemoryAsSent$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), batchMemoryChild+"="+string(job))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "relaying process:\n%s", out)
	var rep *batchMemoryReport
	for sc := bufio.NewScanner(strings.NewReader(string(out))); sc.Scan(); {
		if j, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "report: "); ok {
			require.NoError(t, json.Unmarshal([]byte(j), &rep))
		}
	}
	require.NotNil(t, rep, "no report from the relaying process:\n%s", out)
	t.Logf("relaying process: live heap %.1f MiB holding a batch (%.1f MiB before relaying); peak RSS %.1f MiB (%.1f MiB before); %d batches, at most %d rows in one",
		mib(rep.HeapHeld), mib(rep.HeapIdle), mib(rep.RSSPeak), mib(rep.RSSIdle), rep.Batches, rep.MostClaimed)

	holds := 0
	for _, h := range (&bundle{db: db}).holds(t) {
		require.Equal(t, relay.ReasonTooLarge, h.Reason, "event %d", h.EventID)
		holds++
	}
	require.Equal(t, events, holds, "every row tried and held")
	require.Less(t, rep.HeapHeld, uint64(64<<20), "live heap of the relaying process while it holds a batch")
	// What relaying the batches added to the process's resident set: the
	// payload, pgx's read buffer for it and the collector's headroom (the
	// process itself, before it claims, is ~19 MiB of it, not the
	// batch's). Counted as stored, this was ~300 MiB.
	if !raceEnabled {
		require.Less(t, rep.RSSPeak-rep.RSSIdle, int64(64<<20), "resident set the batches added to the relaying process")
	}
	require.Equal(t, 1, rep.MostClaimed, "each payload is larger than the budget as sent: it must go alone")
}

func mib[N int64 | uint64](n N) float64 { return float64(n) / (1 << 20) }

// heapAtPublish records the live heap while the relayer holds a batch: at
// Publish, after a collection.
type heapAtPublish struct {
	*kafkapub.Publisher
	mu   sync.Mutex
	peak uint64
}

func (p *heapAtPublish) Publish(ctx context.Context, msgs []relay.Message) []error {
	live := liveHeap()
	p.mu.Lock()
	p.peak = max(p.peak, live)
	p.mu.Unlock()
	return p.Publisher.Publish(ctx, msgs)
}

func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// runBatchMemoryChild relays the parent's outbox to its broker until
// every row is dispatched or held, then prints what it measured.
func runBatchMemoryChild(t *testing.T, jobJSON string) {
	var job batchMemoryJob
	require.NoError(t, json.Unmarshal([]byte(jobJSON), &job))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Two connections, as many as a pipelining relayer uses; the checks
	// below take a connection of their own.
	pcfg, err := pgxpool.ParseConfig(job.URL)
	require.NoError(t, err)
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	defer pool.Close()
	check, err := pgx.Connect(ctx, job.URL)
	require.NoError(t, err)
	defer check.Close(context.WithoutCancel(ctx))
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{job.Broker}, Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(30 * time.Second)}})
	require.NoError(t, err)
	defer client.Close()
	pub := &heapAtPublish{Publisher: kafkapub.NewPublisher(client, kafkapub.PublisherConfig{})}

	var (
		mu            sync.Mutex
		most, batches int
	)
	tables := outbox.Tables{Schema: job.Schema}.WithDefaults()
	r, err := relay.New(relay.Config{
		Common: relay.Common{Pool: pool, Tables: tables, Sink: pub, MaxBatchBytes: job.Budget, Logger: slog.New(slog.DiscardHandler),
			Hooks: []relay.Hook{onBatch(func(res relay.BatchResult) {
				mu.Lock()
				defer mu.Unlock()
				most, batches = max(most, res.Claimed), batches+1
			})}},
		PollInterval: 50 * time.Millisecond, PollOnly: true,
	})
	require.NoError(t, err)
	rep := batchMemoryReport{HeapIdle: liveHeap(), RSSIdle: vmHWM(t)}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	unsettled := "SELECT count(*) FROM " + tables.OutboxIdent() + " o WHERE dispatched_at IS NULL AND NOT EXISTS (SELECT 1 FROM " +
		migrate.FailuresIdent(tables) + " f WHERE f.event_id = o.id)"
	for {
		var n int
		require.NoError(t, check.QueryRow(ctx, unsettled).Scan(&n))
		if n == 0 {
			break
		}
		require.NoError(t, ctx.Err(), "%d rows neither dispatched nor held", n)
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	require.NoError(t, <-done)
	rep.RSSPeak = vmHWM(t)
	mu.Lock()
	rep.MostClaimed, rep.Batches = most, batches
	mu.Unlock()
	pub.mu.Lock()
	rep.HeapHeld = pub.peak
	pub.mu.Unlock()
	j, err := json.Marshal(rep)
	require.NoError(t, err)
	fmt.Printf("report: %s\n", j)
}

// vmHWM is this process's peak resident set, from /proc/self/status.
func vmHWM(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err, "the memory test needs Linux /proc")
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}
