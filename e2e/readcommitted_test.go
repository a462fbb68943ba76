package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
)

// Readers the project did not write, reading with
// isolation.level=read_committed: kcat and Python's confluent-kafka, both on
// librdkafka. The exactly-once tests read through them so that "exactly
// once" is what a third-party consumer sees, not what our own client
// thinks.

// committedQuiet is how long a reader must see nothing new, once it has
// what the test wants, before it stops: long enough for records of a late
// commit (and duplicates) to show up, a few of librdkafka's fetch waits
// (fetch.wait.max.ms defaults to 500 ms).
const committedQuiet = 2 * time.Second

// readCommittedKcat reads the whole of topic with kcat
// (-X isolation.level=read_committed) until it has read at least want
// records and then nothing new for a while, failing t after timeout with
// what it read.
func readCommittedKcat(t *testing.T, addr, topic string, want int, timeout time.Duration) []delivered {
	t.Helper()
	return readCommittedWith(t, kcatReader(t, addr, topic), want, timeout, nil)
}

// readCommittedPython is readCommittedKcat with Python's confluent-kafka
// (e2e/testdata/read_committed.py).
func readCommittedPython(t *testing.T, addr, topic string, want int, timeout time.Duration) []delivered {
	t.Helper()
	return readCommittedWith(t, pythonReader(t, addr, topic), want, timeout, nil)
}

// kcatReader is the kcat command line that prints every committed record
// of topic as a JSON line. It runs without -e: kcat's end of partition
// under read_committed is the last stable offset, so with a transaction
// still open it would exit before records that are committed but lie
// behind the open one. Without -e it waits for them, and the caller stops
// it once it has read enough.
func kcatReader(t *testing.T, addr, topic string) []string {
	t.Helper()
	path, err := exec.LookPath("kcat")
	if err != nil {
		missing(t, "kcat is not on PATH", "apt-get install kcat")
	}
	return []string{path, "-C", "-b", addr, "-t", topic, "-o", "beginning", "-X", "isolation.level=read_committed",
		"-J", "-u", "-q"}
}

// pythonReader is the Python command line that does what kcatReader's
// does, through confluent-kafka.
func pythonReader(t *testing.T, addr, topic string) []string {
	t.Helper()
	const python = "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import confluent_kafka").CombinedOutput(); err != nil {
		missing(t, fmt.Sprintf("%s cannot import confluent_kafka (%v: %s)", python, err, strings.TrimSpace(string(out))),
			"apt-get install python3-confluent-kafka")
	}
	return []string{python, "-u", "testdata/read_committed.py", addr, topic}
}

// missing fails t in CI, which must run every reader, and skips it
// elsewhere, saying what to install.
func missing(t *testing.T, what, install string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s; CI must run the read_committed readers (.ci/run installs them: %s)", what, install)
	}
	t.Skipf("%s; install it to run this test (%s)", what, install)
}

// readerLine is one record as the readers print it: kcat -J's shape.
type readerLine struct {
	Partition int32           `json:"partition"`
	Offset    int64           `json:"offset"`
	TS        int64           `json:"ts"`
	Headers   json.RawMessage `json:"headers"`
	Key       *string         `json:"key"`
}

// parseReaderLine decodes a line into a delivery. kcat prints headers as a
// flat [name, value, ...] array (some versions as an object).
func parseReaderLine(line []byte) (delivered, error) {
	var r readerLine
	if err := json.Unmarshal(line, &r); err != nil {
		return delivered{}, err
	}
	h := map[string]string{}
	if len(r.Headers) > 0 && r.Headers[0] == '{' {
		if err := json.Unmarshal(r.Headers, &h); err != nil {
			return delivered{}, fmt.Errorf("headers: %w", err)
		}
	} else if len(r.Headers) > 0 && string(r.Headers) != "null" {
		var flat []string
		if err := json.Unmarshal(r.Headers, &flat); err != nil || len(flat)%2 != 0 {
			return delivered{}, fmt.Errorf("headers %s are not name, value pairs", r.Headers)
		}
		for i := 0; i < len(flat); i += 2 {
			h[flat[i]] = flat[i+1]
		}
	}
	d := delivered{partition: r.Partition, at: time.UnixMilli(r.TS), source: h[outbox.HeaderEventSource]}
	if r.Key != nil {
		d.key = *r.Key
	}
	d.id, _ = strconv.ParseInt(h[outbox.HeaderEventID], 10, 64) // 0 when missing: never a committed id
	return d, nil
}

// readCommittedWith runs a reader (argv) and collects its records until it
// has at least want and nothing new came for committedQuiet, failing t
// after timeout or when the reader exits. progress, if set, is called with
// the records so far after each one: a test can act on what the reader has
// seen.
func readCommittedWith(t *testing.T, argv []string, want int, timeout time.Duration, progress func(sofar []delivered)) []delivered {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = 5 * time.Second
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start(), "start %s", argv[0])
	type result struct {
		d   delivered
		err error
	}
	lines := make(chan result)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			d, err := parseReaderLine(sc.Bytes())
			if err != nil {
				err = fmt.Errorf("line %q: %w", sc.Text(), err)
			}
			select {
			case lines <- result{d, err}:
			case <-ctx.Done():
				return
			}
		}
	}()
	defer func() {
		cancel() // kills the reader, which ends the scanner
		for range lines {
		}
		_ = cmd.Wait()
	}()
	name := strings.Join(argv, " ")
	var got []delivered
	last, deadline := time.Now(), time.After(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r, ok := <-lines:
			if !ok {
				t.Fatalf("%s exited after reading %d of the %d records wanted: %v\n%s", name, len(got), want, cmd.Wait(), stderr.String())
			}
			require.NoError(t, r.err, "%s printed a line that is not a record", name)
			got, last = append(got, r.d), time.Now()
			if progress != nil {
				progress(got)
			}
		case <-tick.C:
			if len(got) >= want && time.Since(last) >= committedQuiet {
				return got
			}
		case <-deadline:
			t.Fatalf("%s read %d records within %s; the test wants %d (ids %s)\n%s", name, len(got), timeout, want,
				idSample(got), stderr.String())
		}
	}
}

// deliveredIDs returns the ids of ds.
func deliveredIDs(ds []delivered) []int64 {
	out := make([]int64, len(ds))
	for i, d := range ds {
		out[i] = d.id
	}
	return out
}

// idSample lists the first few ids of ds, for failure messages.
func idSample(ds []delivered) string {
	ids := make([]string, 0, 20)
	for _, d := range ds[:min(len(ds), 20)] {
		ids = append(ids, strconv.FormatInt(d.id, 10))
	}
	if len(ds) > 20 {
		ids = append(ids, "...")
	}
	return strings.Join(ids, " ")
}

// eosCount is how far a read is from exactly once.
type eosCount struct {
	lost       int // committed ids never read
	dups       int // reads of an id beyond its first
	misordered int // reads of an aggregate after a later id of it, or in a second partition
	foreign    int // reads of an id that was never committed, or under another aggregate's key
	examples   []string
}

func (c *eosCount) example(format string, args ...any) {
	if len(c.examples) < 5 {
		c.examples = append(c.examples, fmt.Sprintf(format, args...))
	}
}

// exactlyOnceCounts compares what a reader got (each partition's records
// in offset order) with the committed ids by aggregate. Ids of one
// aggregate ascend in its commit order (the producer holds the aggregate's
// lock), so order is checked on ids.
func exactlyOnceCounts(committed map[uuid.UUID][]int64, got []delivered) eosCount {
	var c eosCount
	aggOf := map[int64]uuid.UUID{}
	for agg, ids := range committed {
		for _, id := range ids {
			aggOf[id] = agg
		}
	}
	seen := map[int64]bool{}
	partition := map[string]int32{}
	last := map[string]int64{}
	for _, d := range got {
		agg, ok := aggOf[d.id]
		switch {
		case !ok:
			c.foreign++
			c.example("event %d (key %s, partition %d) was never committed", d.id, d.key, d.partition)
			continue
		case agg.String() != d.key:
			c.foreign++
			c.example("event %d of aggregate %s came with key %q", d.id, agg, d.key)
			continue
		case seen[d.id]:
			c.dups++
			c.example("event %d (aggregate %s) read again", d.id, d.key)
			continue
		}
		seen[d.id] = true
		if p, ok := partition[d.key]; ok && p != d.partition {
			c.misordered++
			c.example("aggregate %s: event %d in partition %d, earlier ones in %d", d.key, d.id, d.partition, p)
			continue
		}
		partition[d.key] = d.partition
		if d.id < last[d.key] {
			c.misordered++
			c.example("aggregate %s: event %d read after event %d", d.key, d.id, last[d.key])
			continue
		}
		last[d.key] = d.id
	}
	lost := make([]int64, 0)
	for id := range aggOf {
		if !seen[id] {
			lost = append(lost, id)
		}
	}
	slices.Sort(lost)
	c.lost = len(lost)
	for _, id := range lost[:min(len(lost), 5)] {
		c.example("event %d (aggregate %s) never read", id, aggOf[id])
	}
	return c
}

// exactlyOnce fails t unless got holds every committed id exactly once,
// each aggregate in one partition and in commit order, and nothing else.
// It returns the lost and duplicate counts for the test to report.
func exactlyOnce(t *testing.T, committed map[uuid.UUID][]int64, got []delivered) (lost, dups int) {
	t.Helper()
	c := exactlyOnceCounts(committed, got)
	if c.lost+c.dups+c.misordered+c.foreign > 0 {
		t.Errorf("not exactly once: %d lost, %d duplicates, %d out of order, %d never committed, in %d reads; for example:\n  %s",
			c.lost, c.dups, c.misordered, c.foreign, len(got), strings.Join(c.examples, "\n  "))
	}
	return c.lost, c.dups
}

// Both readers return exactly the committed records: not those of an
// aborted transaction, and those of a transaction that was open when they
// started once it commits, with the records another transaction committed
// behind it.
func TestReadCommittedReadersSkipAbortedTransactions(t *testing.T) {
	t.Parallel()
	b, err := devkafka.Start(devkafka.Config{Partitions: 6})
	require.NoError(t, err)
	t.Cleanup(b.Close) // after the parallel subtests
	for _, reader := range []struct {
		name string
		argv func(t *testing.T, addr, topic string) []string
		read func(t *testing.T, addr, topic string, want int, timeout time.Duration) []delivered
	}{{"kcat", kcatReader, readCommittedKcat}, {"python", pythonReader, readCommittedPython}} {
		t.Run(reader.name, func(t *testing.T) {
			t.Parallel()
			topic := "eos-readers-" + reader.name
			argv := reader.argv(t, b.Addr(), topic)
			s := writeTransactions(t, b.Addr(), topic)
			var beforeCommit []delivered
			got := readCommittedWith(t, argv, s.want, 60*time.Second, func(sofar []delivered) {
				if len(sofar) == s.visibleBeforeOpen && beforeCommit == nil {
					// The reader has everything in front of the open
					// transaction and can go no further until it ends.
					beforeCommit = slices.Clone(sofar)
					s.commitOpen()
				}
			})
			require.ElementsMatch(t, s.firstIDs, deliveredIDs(beforeCommit), "what the reader had read while a transaction was open")
			lost, dups := exactlyOnce(t, s.committed, got)
			require.Zero(t, lost+dups)
			require.Equal(t, s.want, len(got), "records read")
			// A reader started after the last commit (as the e2e tests
			// start theirs) reads the same.
			lost, dups = exactlyOnce(t, s.committed, reader.read(t, b.Addr(), topic, s.want, 60*time.Second))
			require.Zero(t, lost+dups)
			// The aborted records are in the log: the reader skipped them.
			all := kafkatest.Read(t, b.Addr(), 30*time.Second, kafkatest.AtLeast(s.logged), topic)
			require.Len(t, all, s.logged, "read_uncommitted sees the aborted records too")
		})
	}
}

// txnScenario is what writeTransactions left on a topic.
type txnScenario struct {
	committed         map[uuid.UUID][]int64
	want              int     // committed records, once commitOpen is called
	visibleBeforeOpen int     // committed records in front of the open transaction
	firstIDs          []int64 // their ids
	logged            int     // records in the log, aborted ones included
	commitOpen        func()
}

// writeTransactions writes, with transactional franz-go producers, one
// record per aggregate (aggregate i in partition i%6, so that every
// partition has some) in each of: a committed transaction, an aborted one,
// one left open, and one another producer commits behind the open one.
func writeTransactions(t *testing.T, addr, topic string) txnScenario {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const aggregates, partitions = 12, 6
	aggs := make([]uuid.UUID, aggregates)
	for i := range aggs {
		aggs[i] = uuid.New()
	}
	admin, err := kgo.NewClient(kgo.SeedBrokers(addr))
	require.NoError(t, err)
	defer admin.Close()
	_, err = kadm.NewClient(admin).CreateTopic(ctx, partitions, 1, nil, topic)
	require.NoError(t, err)
	s := txnScenario{committed: map[uuid.UUID][]int64{}}
	next := int64(0)
	round := func(commit bool) []*kgo.Record {
		rs := make([]*kgo.Record, aggregates)
		for i, agg := range aggs {
			next++
			rs[i] = &kgo.Record{Topic: topic, Partition: int32(i % partitions), Key: []byte(agg.String()), Value: []byte(`{}`),
				Headers: []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte(strconv.FormatInt(next, 10))},
					{Key: outbox.HeaderEventSource, Value: []byte("eos-readers")}}}
			if commit {
				s.committed[agg] = append(s.committed[agg], next)
			}
		}
		s.logged += len(rs)
		return rs
	}
	producer := func(id string) *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.TransactionalID(topic+"/"+id),
			kgo.RecordPartitioner(kgo.ManualPartitioner()))
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		return cl
	}
	begin := func(cl *kgo.Client, rs []*kgo.Record) {
		require.NoError(t, cl.BeginTransaction())
		require.NoError(t, cl.ProduceSync(ctx, rs...).FirstErr())
	}
	first, second := producer("first"), producer("second")
	begin(first, round(true))
	require.NoError(t, first.EndTransaction(ctx, kgo.TryCommit))
	begin(first, round(false))
	require.NoError(t, first.EndTransaction(ctx, kgo.TryAbort))
	s.visibleBeforeOpen = s.logged - aggregates
	for i := range int64(aggregates) {
		s.firstIDs = append(s.firstIDs, i+1)
	}
	begin(first, round(true)) // left open
	begin(second, round(true))
	require.NoError(t, second.EndTransaction(ctx, kgo.TryCommit))
	s.want = s.logged - aggregates
	s.commitOpen = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, first.EndTransaction(ctx, kgo.TryCommit))
	}
	return s
}

// exactlyOnceCounts finds each way a read can fall short of exactly once.
func TestExactlyOnceCountsFlagsEachDeviation(t *testing.T) {
	t.Parallel()
	a, b := uuid.New(), uuid.New()
	committed := map[uuid.UUID][]int64{a: {1, 3, 4}, b: {2, 5}}
	read := func(ids ...int64) []delivered {
		out := make([]delivered, len(ids))
		for i, id := range ids {
			agg, p := a, int32(0)
			if id == 2 || id == 5 {
				agg, p = b, 1
			}
			out[i] = delivered{key: agg.String(), partition: p, id: id}
		}
		return out
	}
	zero := eosCount{}
	for _, c := range []struct {
		name string
		got  []delivered
		want eosCount
	}{
		{"exact", read(1, 2, 3, 5, 4), zero},
		{"duplicate", read(1, 2, 3, 3, 4, 5), eosCount{dups: 1}},
		{"redelivered suffix", read(1, 3, 4, 2, 5, 3, 4), eosCount{dups: 2}},
		{"lost", read(1, 2, 4, 5), eosCount{lost: 1}},
		{"swapped", read(1, 2, 4, 3, 5), eosCount{misordered: 1}},
		{"two partitions", append(read(1, 2, 3, 5), delivered{key: a.String(), partition: 1, id: 4}), eosCount{misordered: 1}},
		{"never committed", read(1, 2, 3, 4, 5, 6), eosCount{foreign: 1}},
		{"wrong key", append(read(1, 2, 3, 5), delivered{key: b.String(), partition: 1, id: 4}), eosCount{lost: 1, foreign: 1}},
	} {
		got := exactlyOnceCounts(committed, c.got)
		require.Len(t, got.examples, got.lost+got.dups+got.misordered+got.foreign, c.name)
		got.examples = nil
		require.Equal(t, c.want, got, c.name)
	}
}
