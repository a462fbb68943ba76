package consumer

import (
	"context"
)

// processOne processes one record with the Dispatcher's retries,
// dead-lettering it when its handler keeps failing, or at once when the
// processed table refuses its data (see classify). prior, when set, is the
// record's failure in a batch: its first attempt. It returns false if it
// gave up because stop was cancelled; the record is then not done.
func (c *Consumer) processOne(stop, work context.Context, it item, prior *HandlerError) bool {
	log := c.log.With("topic", it.rec.Topic, "partition", it.rec.Partition, "offset", it.rec.Offset)
	res := c.disp.process(stop, work, it.ev, log, prior)
	switch res.Verdict {
	case Done:
		return true
	case DeadLetter:
		return c.deadLetter(stop, work, it.rec, res.Attempts, res.Reason)
	}
	return false
}
