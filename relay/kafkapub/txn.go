package kafkapub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/internal/kafkatopic"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
)

// Defaults of TxConfig.
const (
	// DefaultProgressTopic is where lanes record their progress.
	DefaultProgressTopic = "outbox-progress"
	// DefaultTransactionTimeout is how long the broker lets a lane's
	// transaction stay open before it aborts it. It bounds how long a
	// relayer that died mid-transaction holds back readers of committed
	// data on the partitions it wrote to, when no relayer opens its lane
	// again sooner.
	DefaultTransactionTimeout = 10 * time.Second
)

// TxConfig configures a TxPublisher's transactions.
type TxConfig struct {
	// Client reaches the cluster; each lane opens its own client from it,
	// with the lane's transactional id. Required.
	Client kafka.ClientConfig
	// ProgressTopic is the compacted topic where every transaction
	// records its lane's progress, keyed by the lane's transactional id
	// (in the spirit of Kafka Connect's offsets topic, KIP-618). It is
	// created (one partition, cleanup.policy=compact) when missing.
	// Defaults to DefaultProgressTopic.
	ProgressTopic string
	// TransactionTimeout is the broker's timeout for a lane's open
	// transaction. Defaults to DefaultTransactionTimeout.
	TransactionTimeout time.Duration
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg TxConfig) WithDefaults() TxConfig {
	if cfg.ProgressTopic == "" {
		cfg.ProgressTopic = DefaultProgressTopic
	}
	if cfg.TransactionTimeout == 0 {
		cfg.TransactionTimeout = DefaultTransactionTimeout
	}
	return cfg
}

// Validate reports the first field of cfg that a TxPublisher cannot use.
func (cfg TxConfig) Validate() error {
	cfg = cfg.WithDefaults()
	if err := cfg.Client.Validate(); err != nil {
		return fmt.Errorf("kafkapub: TxConfig.Client: %w", err)
	}
	if err := kafkatopic.Validate(cfg.ProgressTopic); err != nil {
		return fmt.Errorf("kafkapub: TxConfig.ProgressTopic: %w", err)
	}
	if cfg.TransactionTimeout < time.Second {
		return fmt.Errorf("kafkapub: TxConfig.TransactionTimeout is %s; use at least 1s (longer than a batch takes to publish), or 0 for the default %s", cfg.TransactionTimeout, DefaultTransactionTimeout)
	}
	return nil
}

// TxPublisher is a Publisher that also publishes in transactions: a
// relay.TransactionalSink, for sources with relay.Common.ExactlyOnce. Its
// plain Publish, Routing, ErrorCode and Ready are the Publisher's, on the
// client it was made with; each lane (OpenLane) produces on a client of its
// own whose transactional id is the lane's.
//
// A lane's transaction holds the batch's records and one record on the
// progress topic, keyed by the lane's id, whose value is the source's
// progress. A transaction with any record refused is aborted whole:
// nothing of it becomes visible, and the error of the record that caused
// it says why (when the broker refuses a request as a whole, the records
// are sent again in halves, in transactions that are always aborted, to
// find the one to blame).
type TxPublisher struct {
	*Publisher
	cfg TxConfig

	mu          sync.Mutex
	topicReady  bool
	partitioner kgo.TopicPartitioner
}

var _ relay.TransactionalSink = (*TxPublisher)(nil)

// NewTxPublisher wraps client, a client from NewPublisherClient on the
// same cluster as tcfg.Client, as NewPublisher does, with transactions
// configured by tcfg.
func NewTxPublisher(client *kgo.Client, pcfg PublisherConfig, tcfg TxConfig) (*TxPublisher, error) {
	if err := tcfg.Validate(); err != nil {
		return nil, err
	}
	tcfg = tcfg.WithDefaults()
	return &TxPublisher{
		Publisher:   NewPublisher(client, pcfg),
		cfg:         tcfg,
		partitioner: kgo.StickyKeyPartitioner(nil).ForTopic(tcfg.ProgressTopic),
	}, nil
}

// OpenLane opens the lane id: a client with transactional id id, whose
// producer id it loads at once, which fences every earlier holder of id
// (the broker aborts its open transaction and refuses its commits). It
// then reads the progress last committed under id.
func (t *TxPublisher) OpenLane(ctx context.Context, id string) (relay.Lane, []byte, error) {
	if err := t.ensureProgressTopic(ctx); err != nil {
		return nil, nil, err
	}
	opts, err := t.cfg.Client.Options()
	if err != nil {
		return nil, nil, err
	}
	// With partitionHook, as the lane's Publisher shares t's limits and
	// so waits for its records to be partitioned before it flushes.
	own := append(kafka.TransactionalProducerOptions(id, t.cfg.TransactionTimeout),
		kgo.ProducerBatchMaxBytesFn(t.limits.batchMaxBytes), kgo.ManualFlushing(), kgo.WithHooks(partitionHook{}))
	cl, err := kgo.NewClient(append(own, opts...)...)
	if err != nil {
		return nil, nil, err
	}
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		return nil, nil, fmt.Errorf("kafkapub: open lane %q: %w", id, laneErr(err))
	}
	progress, err := t.readProgress(ctx, id)
	if err != nil {
		cl.Close()
		return nil, nil, fmt.Errorf("kafkapub: open lane %q: read its progress from %q: %w", id, t.cfg.ProgressTopic, err)
	}
	pub := &Publisher{client: cl, source: t.source, ce: t.ce, limits: t.limits, log: t.log}
	return &lane{id: id, t: t, pub: pub}, progress, nil
}

// ensureProgressTopic creates the progress topic when it is missing, once
// per TxPublisher.
func (t *TxPublisher) ensureProgressTopic(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.topicReady {
		return nil
	}
	adm := kadm.NewClient(t.client)
	resp, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": new("compact")}, t.cfg.ProgressTopic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("kafkapub: create the progress topic %q: %w (create it yourself with cleanup.policy=compact, or let the relayer create topics)", t.cfg.ProgressTopic, err)
	}
	t.topicReady = true
	return nil
}

// lane is one transactional id's client (relay.Lane).
type lane struct {
	id  string
	t   *TxPublisher
	pub *Publisher // on the lane's own client
}

// errAborted is the error of a message that rode in an aborted
// transaction without causing the abort.
var errAborted = fmt.Errorf("not published: %w", relay.ErrAborted)

// Publish sends msgs and the progress record in one transaction. It
// gives up after the transaction timeout, by which the broker aborts a
// transaction left open anyway: the outcome is then unknown to the caller
// (a fenced client's requests can be retried until then).
func (l *lane) Publish(ctx context.Context, msgs []relay.Message, progress []byte) ([]error, error) {
	ctx, cancel := context.WithTimeout(ctx, l.t.cfg.TransactionTimeout)
	defer cancel()
	errs, send, _ := l.pub.admit(ctx, msgs)
	if len(send) < len(msgs) {
		aborted(errs, send)
		return errs, fmt.Errorf("kafkapub: lane %q: a record was refused before sending: %w", l.id, relay.ErrAborted)
	}
	if err := l.pub.client.BeginTransaction(); err != nil {
		return errs, fmt.Errorf("kafkapub: lane %q: begin: %w", l.id, laneErr(err))
	}
	progDone := make(chan error, 1)
	l.pub.client.Produce(ctx, &kgo.Record{Topic: l.t.cfg.ProgressTopic, Key: []byte(l.id), Value: progress}, func(_ *kgo.Record, err error) { progDone <- err })
	l.pub.produce(ctx, msgs, send, errs)
	progErr := <-progDone
	failed := progErr != nil
	for _, err := range errs {
		failed = failed || err != nil
	}
	if !failed {
		if err := l.pub.client.EndTransaction(ctx, kgo.TryCommit); err != nil {
			return errs, fmt.Errorf("kafkapub: lane %q: commit (its outcome is unknown until the lane is opened again): %w", l.id, laneErr(err))
		}
		return errs, nil
	}
	if err := l.abort(ctx); err != nil {
		return errs, err
	}
	if progErr != nil && !anyPermanent(errs) {
		for i := range errs {
			errs[i] = fmt.Errorf("the progress record failed (%w): %w", progErr, errAborted)
		}
		return errs, fmt.Errorf("kafkapub: lane %q: %w", l.id, relay.ErrAborted)
	}
	l.blame(ctx, msgs, send, errs)
	return errs, fmt.Errorf("kafkapub: lane %q: %w", l.id, relay.ErrAborted)
}

// abort ends the open transaction with an abort.
func (l *lane) abort(ctx context.Context) error {
	if err := l.pub.client.AbortBufferedRecords(ctx); err != nil {
		return fmt.Errorf("kafkapub: lane %q: abort: %w", l.id, laneErr(err))
	}
	if err := l.pub.client.EndTransaction(ctx, kgo.TryAbort); err != nil {
		return fmt.Errorf("kafkapub: lane %q: abort: %w", l.id, laneErr(err))
	}
	return nil
}

// blame settles the errors of an aborted transaction's records: a record's
// own permanent error stays; records the broker refused as a whole request
// are sent again in halves, each half in a transaction that is aborted
// whatever happens, until the culprits stand alone; every other record
// gets errAborted, to be sent again.
func (l *lane) blame(ctx context.Context, msgs []relay.Message, idx []int, errs []error) {
	var refused []int
	for _, i := range idx {
		switch {
		case errs[i] == nil:
			errs[i] = errAborted
		case refusedAsBatch(errs[i]) && len(idx) > 1:
			refused = append(refused, i)
		case !relay.IsPermanent(errs[i]):
			errs[i] = fmt.Errorf("%w: %w", errs[i], errAborted)
		}
	}
	l.probe(ctx, msgs, refused, errs)
}

// probe sends the records of idx, refused together as a whole request, in
// two halves, each in a transaction it aborts: a half that goes through
// is innocent (errAborted), a half refused again is probed in turn, down
// to single records, which are the culprits.
func (l *lane) probe(ctx context.Context, msgs []relay.Message, idx []int, errs []error) {
	if len(idx) == 0 {
		return
	}
	if len(idx) == 1 {
		return // refused alone: its error (classified by produce) is its own
	}
	for _, half := range [][]int{idx[:len(idx)/2], idx[len(idx)/2:]} {
		sub := make([]error, len(msgs))
		if err := l.pub.client.BeginTransaction(); err != nil {
			aborted(errs, half)
			continue
		}
		l.pub.produce(ctx, msgs, half, sub)
		if l.abort(ctx) != nil {
			aborted(errs, half)
			continue
		}
		var again []int
		for _, i := range half {
			if refusedAsBatch(sub[i]) {
				errs[i] = sub[i]
				again = append(again, i)
			} else {
				errs[i] = errAborted
			}
		}
		l.probe(ctx, msgs, again, errs)
	}
}

// aborted gives the records of idx errAborted.
func aborted(errs []error, idx []int) {
	for _, i := range idx {
		errs[i] = errAborted
	}
}

func anyPermanent(errs []error) bool {
	for _, err := range errs {
		if relay.IsPermanent(err) || refusedAsBatch(err) {
			return true
		}
	}
	return false
}

// Close closes the lane's client; an open transaction is left for the
// broker to abort.
func (l *lane) Close() { l.pub.client.Close() }

// laneErr wraps the errors that mean another holder took the lane's id
// with relay.ErrFenced.
func laneErr(err error) error {
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.InvalidProducerIDMapping) {
		return fmt.Errorf("%w: %w", relay.ErrFenced, err)
	}
	return err
}

// readProgress returns the value of the last committed record keyed id on
// the progress topic, or nil when there is none. It reads the key's
// partition backwards from its high watermark, in windows growing
// eightfold, with read_committed isolation: what an aborted or fenced
// transaction wrote never counts. Not from the last stable offset: other
// lanes share the partition, and one of their transactions still open
// holds the last stable offset before records this lane committed after
// it began; reading only up to there would return stale progress, and the
// source would publish a committed batch again. Up to the high watermark,
// the read waits for such transactions to end (their holders commit or
// abort within a batch, the broker aborts them at their timeout).
func (t *TxPublisher) readProgress(ctx context.Context, id string) ([]byte, error) {
	adm := kadm.NewClient(t.client)
	topic := t.cfg.ProgressTopic
	details, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return nil, err
	}
	td, ok := details[topic]
	if !ok || td.Err != nil || len(td.Partitions) == 0 {
		return nil, fmt.Errorf("the topic is not readable: %v", td.Err)
	}
	p := int32(t.partitioner.Partition(&kgo.Record{Key: []byte(id)}, len(td.Partitions)))
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	end, eok := ends.Lookup(topic, p)
	start, sok := starts.Lookup(topic, p)
	if !eok || !sok || end.Err != nil || start.Err != nil {
		return nil, fmt.Errorf("no offsets for partition %d: %v %v", p, end.Err, start.Err)
	}
	for window := int64(1000); ; window *= 8 {
		from := max(start.Offset, end.Offset-window)
		value, found, err := t.scan(ctx, p, from, end.Offset, id)
		if err != nil || found || from == start.Offset {
			return value, err
		}
	}
}

// scan reads partition p of the progress topic from offset from up to
// end (exclusive) with read_committed isolation and returns the value of
// the last record keyed id.
func (t *TxPublisher) scan(ctx context.Context, p int32, from, end int64, id string) (value []byte, found bool, err error) {
	if from >= end {
		return nil, false, nil
	}
	opts, err := t.cfg.Client.Options()
	if err != nil {
		return nil, false, err
	}
	cl, err := kgo.NewClient(append(opts,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{t.cfg.ProgressTopic: {p: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())...)
	if err != nil {
		return nil, false, err
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return nil, false, errs[0].Err
		}
		last := int64(-1)
		fetches.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end {
				return
			}
			last = max(last, r.Offset)
			if !r.Attrs.IsControl() && string(r.Key) == id {
				value, found = r.Value, true
			}
		})
		// Offsets before end come back as committed records or
		// transaction markers, once their transactions ended; aborted
		// records never do, but their markers come after them.
		if last >= end-1 || fetchedPast(fetches, end) {
			return value, found, nil
		}
	}
}

// fetchedPast reports whether fetches hold a record at or past end.
func fetchedPast(fetches kgo.Fetches, end int64) bool {
	past := false
	fetches.EachRecord(func(r *kgo.Record) { past = past || r.Offset >= end })
	return past
}
