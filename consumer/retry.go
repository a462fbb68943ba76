package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/pgoutbox/outbox/internal/backoff"
)

// processOne processes one record with retries, dead-lettering it when its
// handler keeps failing, or at once when the processed table refuses its
// data (see classify). prior, when set, is the record's failure in a
// batch: its first attempt. It returns false if it gave up because stop was
// cancelled; the record is then not done.
func (c *Consumer) processOne(stop, work context.Context, it item, prior *HandlerError) bool {
	attempts, outages := 0, 0
	var err error
	if prior != nil {
		err = prior
	}
	for stop.Err() == nil {
		if err == nil {
			if _, err = c.proc.Process(work, it.ev, c.dispatch); err == nil {
				return true
			}
		}
		if work.Err() != nil {
			return false
		}
		blame := classify(err)
		if blame == theRecord {
			c.log.Error("the processed table refuses the event; dead-lettering the record", "topic", it.rec.Topic, "partition", it.rec.Partition,
				"offset", it.rec.Offset, "event_id", it.ev.ID, "err", err)
			return c.deadLetter(stop, work, it.rec, attempts, err.Error())
		}
		if blame == notTheEvent || c.pool().Ping(work) != nil {
			// The database failed, not the handler (or the handler failed
			// because the database is gone, or lost a deadlock or
			// serialisation conflict with another transaction): nothing is
			// wrong with the event, so wait and retry without counting an
			// attempt.
			outages++
			c.retries.Add(1)
			d := backoff.Delay(c.cfg.BackoffMin, c.cfg.BackoffMax, outages)
			c.log.Warn("processing failed, not for the event's fault; retrying", "err", err, "event_id", it.ev.ID, "retry_in", d.Round(time.Millisecond))
			if !backoff.Sleep(stop, d) {
				return false
			}
			err = nil
			continue
		}
		var he *HandlerError
		if !errors.As(err, &he) { // the commit refused the handler's writes
			he = &HandlerError{Source: it.ev.Source, EventID: it.ev.ID, Err: err}
		}
		attempts++
		log := c.log.With("topic", it.rec.Topic, "partition", it.rec.Partition, "offset", it.rec.Offset,
			"event_id", it.ev.ID, "event_type", it.ev.Type, "attempt", attempts)
		if IsPermanent(err) || attempts >= c.cfg.MaxAttempts {
			var pe *PanicError
			if errors.As(err, &pe) {
				log = log.With("stack", string(pe.Stack))
			}
			log.Error("handler failed; dead-lettering the record", "err", he.Err)
			return c.deadLetter(stop, work, it.rec, attempts, he.Err.Error())
		}
		c.retries.Add(1)
		d := backoff.Delay(c.cfg.BackoffMin, c.cfg.BackoffMax, attempts)
		log.Warn("handler failed; retrying", "err", he.Err, "retry_in", d.Round(time.Millisecond))
		if !backoff.Sleep(stop, d) {
			return false
		}
		err = nil
	}
	return false
}
