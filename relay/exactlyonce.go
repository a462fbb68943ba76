package relay

import (
	"context"
	"errors"
	"fmt"
)

// TransactionalSink is a Sink that can publish a batch and a source's
// progress in one broker transaction: every message and the progress
// become visible together to readers that read only committed data, or
// none of them does. Sources use it when Common.ExactlyOnce is set
// (kafkapub.TxPublisher implements it for Kafka).
//
// A lane is one transactional identity. Opening it fences every earlier
// holder of the same id, in this process or another: the broker aborts the
// earlier holder's open transaction and refuses its later commits. What
// the earlier holder committed stays, and OpenLane returns the progress
// its last committed transaction recorded, so that the source can tell
// what is already published. A source keeps its lane ids stable across
// restarts (the WAL source: one per slot; the polling source: one per
// lane of its table), so that a restarted or replacing relayer fences the
// one it replaces.
type TransactionalSink interface {
	Sink
	// OpenLane takes the transactional identity id, fences its earlier
	// holders and returns the lane with the progress last committed under
	// id (nil when none was).
	OpenLane(ctx context.Context, id string) (Lane, []byte, error)
}

// Lane publishes batches in transactions under one transactional id
// (TransactionalSink.OpenLane). It is used by one goroutine at a time.
type Lane interface {
	// Publish sends msgs and progress in one transaction and commits it.
	// It returns nil when the transaction committed: every message and
	// the progress are visible. An error wrapping ErrAborted means the
	// transaction was aborted and nothing of it is visible; errs then
	// says, as Sink.Publish does, which messages caused it (permanent
	// errors) and which merely shared it, and the lane can go on. Any
	// other error leaves the outcome unknown (the commit may or may not
	// have happened) or the lane lost (ErrFenced: another holder opened
	// the id): close the lane and open it again to learn the committed
	// progress, or, on ErrFenced, step down.
	Publish(ctx context.Context, msgs []Message, progress []byte) (errs []error, err error)
	// Close releases the lane. An open transaction is abandoned; the
	// broker aborts it when the id is opened again or when it times out.
	Close()
}

var (
	// ErrAborted wraps a Lane.Publish error after which nothing of the
	// transaction is visible and the lane can go on.
	ErrAborted = errors.New("the transaction was aborted: nothing of it is visible")
	// ErrFenced wraps a Lane.Publish or OpenLane error when another
	// holder opened the lane's transactional id since: this relayer lost
	// the lane and must not publish under it again.
	ErrFenced = errors.New("fenced: another relayer took this transactional id")
)

// transactional returns c.Sink as a TransactionalSink when c.ExactlyOnce
// is set, or an error saying why it cannot be.
func (c Common) transactional() (TransactionalSink, error) {
	ts, ok := c.Sink.(TransactionalSink)
	if !ok {
		return nil, fmt.Errorf("relay: ExactlyOnce needs a sink that publishes in transactions (kafkapub.TxPublisher); %T does not: drop ExactlyOnce, or publish to Kafka", c.Sink)
	}
	return ts, nil
}

// TransactionalSink returns the Sink as a TransactionalSink for a source
// with ExactlyOnce set; an error says why the sink cannot serve it.
func (c Common) TransactionalSink() (TransactionalSink, error) { return c.transactional() }

// LaneID is the transactional id of a source's lane name under c's
// TransactionalID: "<TransactionalID>/<name>".
func (c Common) LaneID(name string) string {
	return c.WithDefaults().TransactionalID + "/" + name
}
