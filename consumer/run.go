package consumer

import (
	"context"
	"errors"
	"fmt"
	"github.com/pgoutbox/outbox/internal/commithook"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox/internal/backoff"
)

// leaveTimeout bounds leaving the group at shutdown (with the final offset
// commit it triggers).
const leaveTimeout = 15 * time.Second

// Run consumes until ctx is cancelled, then lets the transaction in flight
// finish (within ShutdownTimeout), commits the offsets of what is done,
// leaves the group and returns nil. It returns an error only when it cannot
// start (the database is unreachable, or the processed table missing) or
// when it is called twice. Bad records never stop it: they are
// dead-lettered. Database and broker outages are waited out.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("consumer: Run was already called; create a new Consumer to run again")
	}
	c.beforeCommit = commithook.From(ctx)
	if !c.cfg.SkipSchemaCheck {
		if err := c.proc.Check(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	dlqCl, err := kgo.NewClient(c.dlqOpts...)
	if err != nil {
		return fmt.Errorf("consumer: kafka client: %w", err)
	}
	defer dlqCl.Close()
	c.dlqCl = dlqCl
	cl, err := kgo.NewClient(c.opts...)
	if err != nil {
		return fmt.Errorf("consumer: kafka client: %w", err)
	}
	c.client = cl

	// The transaction in flight must not die with ctx: it finishes, then
	// Run returns. Only ShutdownTimeout after cancellation is it cut short.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopAfter := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(c.cfg.ShutdownTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stopAfter()

	c.log.Info("consumer started", "group", c.cfg.Group, "topics", c.cfg.Topics, "batch_size", c.cfg.BatchSize, "max_attempts", c.cfg.MaxAttempts)
	runErr := c.consume(ctx, work, cl)
	c.leave(ctx, cl, runErr)
	if runErr != nil {
		c.log.Error("consumer stopped", "err", runErr)
		return runErr
	}
	c.log.Info("consumer stopped")
	return nil
}

// consume polls and processes until ctx is cancelled or the client closes.
// It returns an error only when the tests' commit hook stopped the consumer.
func (c *Consumer) consume(ctx, work context.Context, cl *kgo.Client) error {
	for ctx.Err() == nil {
		select { // a signal from the previous poll is stale
		case <-c.hurry:
		default:
		}
		fetches := cl.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			return nil
		}
		errored := false
		recreated := map[string][16]byte{} // topic: the id it was fetched under, if known
		fetches.EachTopic(func(t kgo.FetchTopic) {
			for _, p := range t.Partitions {
				if errors.Is(p.Err, kerr.UnknownTopicID) && c.mayFollow(t.Topic) {
					if id := recreated[t.Topic]; id == ([16]byte{}) {
						recreated[t.Topic] = t.TopicID
					}
				}
			}
		})
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			if _, ok := recreated[topic]; ok && errors.Is(err, kerr.UnknownTopicID) {
				return
			}
			errored = true
			c.log.Warn("kafka fetch failed; retrying", "topic", topic, "partition", partition, "err", err)
		})
		// Records that came with UNKNOWN_TOPIC_ID for their topic are of
		// the old topic: they are processed, but their offsets are never
		// committed, since on Kafka before 4.2 a commit goes by topic name
		// and would land on the new topic.
		c.holdOffsets(slices.Collect(maps.Keys(recreated)))
		if fetches.NumRecords() > 0 {
			if err := c.poll(ctx, work, fetches); err != nil {
				return err
			}
		}
		cl.AllowRebalance()
		if len(recreated) > 0 {
			c.follow(ctx, cl, recreated)
		}
		if fetches.NumRecords() == 0 && errored && !backoff.Sleep(ctx, c.cfg.BackoffMin) {
			return nil
		}
	}
	return nil
}

// followEvery is how often one topic is purged and added back at most:
// UNKNOWN_TOPIC_ID that persists after that waits like any fetch error.
const followEvery = 10 * time.Second

// mayFollow reports whether topic was not purged and added back within
// followEvery.
func (c *Consumer) mayFollow(topic string) bool {
	return time.Since(c.followed[topic]) >= followEvery
}

// follow purges topics, which have a new id at the broker, from cl and
// consumes them again. franz-go keeps a topic's first id and answers every
// fetch of a deleted and recreated topic (or of a broker replaced by one
// that lost its state) with UNKNOWN_TOPIC_ID until the topic is purged and
// added back. The done offsets not yet committed are of the old topic and
// were dropped (holdOffsets): the purge's rebalance would commit them to
// the new one. A topic whose id changed starts over from its first offset
// (restart), whatever the group committed for it.
func (c *Consumer) follow(ctx context.Context, cl *kgo.Client, recreated map[string][16]byte) {
	topics := slices.Sorted(maps.Keys(recreated))
	c.log.Warn("Kafka topic has a new id at the broker (deleted and recreated, or the broker was replaced and lost its state); consuming it again from its start",
		"topics", topics)
	if c.followed == nil {
		c.followed = map[string]time.Time{}
	}
	for _, t := range topics {
		c.followed[t] = time.Now()
	}
	cl.PurgeTopicsFromClient(topics...)
	c.restart(ctx, cl, recreated)
	c.holdOffsets(nil)
	cl.AddConsumeTopics(topics...)
}

// restart commits the first offset of every partition of the topics whose
// id changed, before they are consumed again. Until the client learns the
// new id, it commits the offsets of the old topic's records by topic name
// (Kafka before 4.2 takes them so), and they land on the new topic, whose
// first records the consumer would then skip. Reading the new topic from
// its start instead only reads again what another member of the group may
// have processed already: those events are skipped as duplicates. A topic
// the broker still gives the id it was fetched under (a broker that had
// not caught up) keeps its committed offsets.
func (c *Consumer) restart(ctx context.Context, cl *kgo.Client, recreated map[string][16]byte) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	details, err := kadm.NewClient(cl).ListTopics(rctx, slices.Sorted(maps.Keys(recreated))...)
	if err == nil {
		err = details.Error()
	}
	if err != nil {
		c.log.Warn("cannot read the new topic's partitions; it is consumed from its committed offsets, which may be the old topic's and skip its first records",
			"topics", slices.Sorted(maps.Keys(recreated)), "err", err)
		return
	}
	offsets := map[string]map[int32]kgo.EpochOffset{}
	for topic, d := range details {
		if old := recreated[topic]; old != ([16]byte{}) && old == [16]byte(d.ID) {
			c.log.Info("Kafka topic kept its id at the broker; consuming it from its committed offsets", "topic", topic)
			continue
		}
		offsets[topic] = map[int32]kgo.EpochOffset{}
		for p := range d.Partitions {
			offsets[topic][p] = kgo.EpochOffset{Epoch: -1, Offset: 0}
		}
	}
	if len(offsets) == 0 {
		return
	}
	cl.CommitOffsetsSync(rctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err == nil {
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if err = kerr.ErrorForCode(p.ErrorCode); err != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
		}
		if err != nil {
			c.log.Warn("cannot reset the new topic's committed offsets to its start; it is consumed from its committed offsets, which may be the old topic's and skip its first records",
				"offsets", formatEpochOffsets(offsets), "err", err)
		}
	})
}

// leave leaves the group and closes cl. A failure to leave is logged
// unless runErr (why the consumer stopped) is already being reported.
func (c *Consumer) leave(ctx context.Context, cl *kgo.Client, runErr error) {
	// Leaving the group runs onRevoked, which commits any offsets a failed
	// commit left behind. Bound the leave: a dead broker must not hold
	// shutdown forever.
	cl.AllowRebalance()
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaveTimeout)
	if err := cl.LeaveGroupContext(lctx); err != nil && runErr == nil {
		c.log.Warn("leaving the consumer group failed; its partitions move after the session timeout", "err", err)
	}
	cancel()
	cl.Close()
}

// item is one record of a poll, decoded.
type item struct {
	rec *kgo.Record
	ev  Event
	bad *MalformedError
}

// poll processes one poll's records, commits the offsets of what is done,
// and rewinds partitions whose records were abandoned so they are polled
// again. It returns an error only when the tests' commit hook stopped the consumer.
func (c *Consumer) poll(ctx, work context.Context, fetches kgo.Fetches) error {
	// stop ends processing early: on shutdown, or when a rebalance waits.
	stop, cancelStop := context.WithCancel(ctx)
	defer cancelStop()
	go func() {
		select {
		case <-c.hurry:
			c.log.Info("rebalance waiting; yielding after the transaction in flight")
			cancelStop()
		case <-stop.Done():
		}
	}()

	parts := c.decodeFetches(fetches)
	// Commit what is done while the rest of the poll is processed, so a
	// slow or stuck record does not hold back the other partitions'
	// commits.
	committerDone := c.commitEvery(stop, cancelStop)
	done := c.partitions(stop, work, parts)
	cancelStop()
	<-committerDone

	rewind := rewindOffsets(parts, done)
	if err := c.commit(c.client, nil); err != nil {
		return err
	}
	if len(rewind) > 0 && ctx.Err() == nil {
		// The client's fetch position is past the abandoned records; move it
		// back so they come again (after the rebalance, to whichever member
		// then owns the partition: a revoked partition starts from the
		// committed offset anyway).
		c.client.SetOffsets(rewind)
	}
	return nil
}

// decodeFetches decodes a poll's records, one slice per partition.
func (c *Consumer) decodeFetches(fetches kgo.Fetches) [][]item {
	var parts [][]item
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		items := make([]item, len(p.Records))
		for i, r := range p.Records {
			items[i] = c.decode(r)
		}
		c.records.Add(int64(len(items)))
		parts = append(parts, items)
	})
	return parts
}

// commitEvery commits what is done every CommitInterval until stop is
// done, and calls cancelStop if the commit hook stops the consumer. The
// channel it returns closes when it has stopped.
func (c *Consumer) commitEvery(stop context.Context, cancelStop context.CancelFunc) <-chan struct{} {
	committerDone := make(chan struct{})
	go func() {
		defer close(committerDone)
		tick := time.NewTicker(c.cfg.CommitInterval)
		defer tick.Stop()
		for {
			select {
			case <-stop.Done():
				return
			case <-tick.C:
				if err := c.commit(c.client, nil); err != nil {
					cancelStop() // the commit hook stopped us: stop processing
					return
				}
			}
		}
	}()
	return committerDone
}

// partitions processes each partition's records, Concurrency partitions at
// once, and returns how many leading records of each are done.
func (c *Consumer) partitions(stop, work context.Context, parts [][]item) []int {
	done := make([]int, len(parts))
	sem := make(chan struct{}, c.cfg.Concurrency)
	var wg sync.WaitGroup
	for i, items := range parts {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			done[i] = c.partition(stop, work, items)
		})
	}
	wg.Wait()
	return done
}

// rewindOffsets returns, for each partition with abandoned records, the
// offset of its first abandoned record.
func rewindOffsets(parts [][]item, done []int) map[string]map[int32]kgo.EpochOffset {
	rewind := map[string]map[int32]kgo.EpochOffset{}
	for i, items := range parts {
		if n := done[i]; n < len(items) {
			r := items[n].rec
			if rewind[r.Topic] == nil {
				rewind[r.Topic] = map[int32]kgo.EpochOffset{}
			}
			rewind[r.Topic][r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
		}
	}
	return rewind
}

// partition processes one partition's records in order and returns how
// many leading records are done: processed, duplicates or dead-lettered.
// The rest were abandoned because stop was cancelled.
func (c *Consumer) partition(stop, work context.Context, items []item) int {
	i := 0
	for i < len(items) && stop.Err() == nil {
		if items[i].bad != nil {
			if !c.deadLetter(stop, work, items[i].rec, 0, items[i].bad.Error()) {
				return i
			}
			c.malformed.Add(1)
			c.markDone(items[i].rec)
			i++
			continue
		}
		j := i
		for j < len(items) && j-i < c.cfg.BatchSize && items[j].bad == nil {
			j++
		}
		run := items[i:j]
		var failed *HandlerError
		if len(run) > 1 {
			evs := make([]Event, len(run))
			for k, it := range run {
				evs[k] = it.ev
			}
			_, err := c.proc.ProcessBatch(work, evs, c.disp.handle)
			if err == nil {
				c.markDone(run[len(run)-1].rec)
				i = j
				continue
			}
			// One failed (or the database did): one by one, so the rest
			// commit and the failing one is retried or dead-lettered alone.
			// Its failure in the batch counts as its first attempt.
			if !errors.As(err, &failed) {
				failed = nil
			}
		}
		for k, it := range run {
			var prior *HandlerError
			if failed != nil && failed.Index == k {
				prior = failed
			}
			if !c.processOne(stop, work, it, prior) {
				return i
			}
			c.markDone(it.rec)
			i++
		}
	}
	return i
}
