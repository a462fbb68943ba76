package relay

import (
	"time"

	"github.com/pgoutbox/outbox/internal/backoff"
)

// pacer decides, from the outcome of each batch, how big the next claim is
// and when it runs. Run keeps the loop and the timers; the pacer keeps the
// state, so its rules are tested without a database (pacer_test.go).
type pacer struct {
	batchSize, probeSize   int
	pollInterval           time.Duration
	busyPollInterval       time.Duration // negative: off
	backoffMin, backoffMax time.Duration // after a failed batch
	futileMin, futileMax   time.Duration // after a futile claim

	// failures counts the batches failed in a row.
	failures int
	// busy is the wait before the next follow-up claim after rows were
	// found (BusyPollInterval, doubling while claims find nothing); 0 when
	// idle.
	busy time.Duration
	// futile counts claims in a row whose every row waited behind another
	// relayer; while it is not 0, claims are probes of probeSize rows.
	futile int
}

// action says what Run does after a batch that went through.
type action int

const (
	// claimNow: more rows are waiting; claim again at once.
	claimNow action = iota
	// probeLater: sleep the wait, not woken by notifications, then claim
	// (a probe of claimSize rows).
	probeLater
	// pollLater: claim after the wait, or sooner when a notification
	// comes.
	pollLater
)

func newPacer(cfg Config) *pacer {
	return &pacer{
		batchSize:        cfg.BatchSize,
		pollInterval:     cfg.PollInterval,
		busyPollInterval: cfg.BusyPollInterval,
		backoffMin:       cfg.BackoffMin,
		backoffMax:       cfg.BackoffMax,
		futileMin:        5 * time.Millisecond,
		futileMax:        100 * time.Millisecond,
		probeSize:        probeSize,
	}
}

// claimSize is how many rows the next claim asks for: the batch size, or
// a probe's while claims find only rows another relayer holds up.
func (p *pacer) claimSize() int {
	if p.futile > 0 {
		return min(p.batchSize, p.probeSize)
	}
	return p.batchSize
}

// afterError counts a failed batch and returns its attempt number and the
// backoff before the next claim: BackoffMin doubling to BackoffMax, with
// jitter.
func (p *pacer) afterError() (attempt int, wait time.Duration) {
	p.failures++
	return p.failures, backoff.Delay(p.backoffMin, p.backoffMax, p.failures)
}

// afterBatch takes the outcome of a batch that went through: res, whether
// its claim was full (it locked as many rows as it asked for) and whether
// the next batch is already claimed (pipelining).
func (p *pacer) afterBatch(res BatchResult, full, nextClaimed bool) (action, time.Duration) {
	p.failures = 0
	switch {
	case res.Claimed > 0:
		p.busy, p.futile = p.busyPollInterval, 0
	case p.busy > 0:
		p.busy *= 2
	}
	switch {
	case nextClaimed, full && res.Claimed > 0:
		return claimNow, 0
	case res.Locked > 0 && res.Claimed == 0:
		// Everything we could lock waits behind rows another relayer is
		// publishing. Such a claim is not only futile: while it holds its
		// candidates, the other relayer's next claim must skip them and
		// then finds its own aggregates gapped. So back off (5 ms,
		// doubling to 100 ms) and probe with small claims until one finds
		// rows of its own again.
		p.futile++
		return probeLater, backoff.Delay(p.futileMin, p.futileMax, p.futile)
	}
	wait := p.pollInterval
	if p.busy > 0 && p.busy < wait {
		wait = p.busy
	} else {
		p.busy = 0
	}
	return pollLater, wait
}
