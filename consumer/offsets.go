package consumer

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// markDone records that r and every record before it in its partition are
// done, so the next commit moves the partition's offset past r.
func (c *Consumer) markDone(r *kgo.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.Contains(c.held, r.Topic) {
		return
	}
	ps := c.uncommitted[r.Topic]
	if ps == nil {
		ps = map[int32]*kgo.Record{}
		c.uncommitted[r.Topic] = ps
	}
	ps[r.Partition] = r
}

// holdOffsets drops the done offsets of topics not yet committed, and
// commits none of theirs until the next holdOffsets: the topics were
// recreated, and their offsets are of the old topic.
func (c *Consumer) holdOffsets(topics []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range topics {
		delete(c.uncommitted, t)
	}
	c.held = topics
}

// commit commits the done offsets of the given partitions (all when
// partitions is nil). A failed commit is logged and kept for the next
// commit: its records may be redelivered, and are then duplicates.
func (c *Consumer) commit(cl *kgo.Client, partitions map[string][]int32) error {
	c.mu.Lock()
	if c.crashed != nil {
		c.mu.Unlock()
		return c.crashed
	}
	var recs []*kgo.Record
	offsets := map[string]map[int32]int64{}
	for topic, ps := range c.uncommitted {
		for p, r := range ps {
			if partitions != nil && !slices.Contains(partitions[topic], p) {
				continue
			}
			recs = append(recs, r)
			if offsets[topic] == nil {
				offsets[topic] = map[int32]int64{}
			}
			offsets[topic][p] = r.Offset + 1
		}
	}
	if len(recs) == 0 {
		c.mu.Unlock()
		return nil
	}
	if c.beforeCommit != nil {
		if err := c.beforeCommit(offsets); err != nil {
			c.crashed = fmt.Errorf("consumer: stopped before it committed offsets %s: %w", formatOffsets(offsets), err)
			c.mu.Unlock()
			return c.crashed
		}
	}
	c.mu.Unlock()

	// Not under mu: the commit waits for a join in progress, and the
	// group's callbacks take mu.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.CommitRecords(ctx, recs...); err != nil {
		c.log.Warn("offset commit failed; will retry (records past the last commit may be redelivered, and are then skipped as duplicates)",
			"offsets", formatOffsets(offsets), "err", err)
		return nil
	}
	c.mu.Lock()
	for _, r := range recs {
		if c.uncommitted[r.Topic][r.Partition] == r { // not moved on meanwhile
			delete(c.uncommitted[r.Topic], r.Partition)
		}
	}
	c.mu.Unlock()
	return nil
}

func (c *Consumer) onBlocked(context.Context, *kgo.Client) {
	select {
	case c.hurry <- struct{}{}:
	default:
	}
}

// onRevoked commits what is done on the revoked partitions (normally
// nothing: every poll commits before it lets a rebalance run) and forgets
// them.
func (c *Consumer) onRevoked(_ context.Context, cl *kgo.Client, revoked map[string][]int32) {
	_ = c.commit(cl, revoked) // fails only after the commit hook stopped us
	c.forget(revoked)
}

// onLost forgets lost partitions: another member owns them now, and a
// commit would fail (or rewind its progress).
func (c *Consumer) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.forget(lost)
}

func (c *Consumer) forget(partitions map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, ps := range partitions {
		for _, p := range ps {
			delete(c.uncommitted[topic], p)
		}
	}
}

func formatEpochOffsets(offsets map[string]map[int32]kgo.EpochOffset) string {
	plain := map[string]map[int32]int64{}
	for topic, ps := range offsets {
		plain[topic] = map[int32]int64{}
		for p, o := range ps {
			plain[topic][p] = o.Offset
		}
	}
	return formatOffsets(plain)
}

func formatOffsets(offsets map[string]map[int32]int64) string {
	var parts []string
	for topic, ps := range offsets {
		for p, o := range ps {
			parts = append(parts, topic+"/"+strconv.Itoa(int(p))+"@"+strconv.FormatInt(o, 10))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
