package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func testPacer() *pacer {
	return newPacer(Config{
		Common:           Common{BatchSize: 5000, BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second},
		PollInterval:     time.Second,
		BusyPollInterval: 2 * time.Millisecond,
	})
}

// pacerStep is one outcome Run hands the pacer, and what it should answer.
type pacerStep struct {
	res         BatchResult
	full, next  bool
	failed      bool // afterError instead
	wantAction  action
	wantWait    time.Duration // upper bound; jittered waits are within [wantWait/2, wantWait]
	jittered    bool
	wantClaim   int // claimSize after this step
	description string
}

var (
	resFound   = BatchResult{Locked: 10, Claimed: 10}
	resFull    = BatchResult{Locked: 5000, Claimed: 5000}
	resNothing = BatchResult{}
	resBehind  = BatchResult{Locked: 40} // every locked row waits behind another relayer
)

func TestPacerSequences(t *testing.T) {
	t.Parallel()
	for name, seq := range map[string][]pacerStep{
		"failures back off exponentially within BackoffMin and BackoffMax, and reset on success": {
			{failed: true, wantWait: 100 * time.Millisecond, jittered: true, wantClaim: 5000},
			{failed: true, wantWait: 200 * time.Millisecond, jittered: true, wantClaim: 5000},
			{failed: true, wantWait: 400 * time.Millisecond, jittered: true, wantClaim: 5000},
			{failed: true, wantWait: 800 * time.Millisecond, jittered: true, wantClaim: 5000},
			{failed: true, wantWait: time.Second, jittered: true, wantClaim: 5000},
			{failed: true, wantWait: time.Second, jittered: true, wantClaim: 5000},
			{res: resNothing, wantAction: pollLater, wantWait: time.Second, wantClaim: 5000},
			{failed: true, wantWait: 100 * time.Millisecond, jittered: true, wantClaim: 5000, description: "the count restarted"},
		},
		"the busy interval doubles up to PollInterval while claims find nothing": {
			{res: resFound, wantAction: pollLater, wantWait: 2 * time.Millisecond, wantClaim: 5000},
			{res: resNothing, wantAction: pollLater, wantWait: 4 * time.Millisecond, wantClaim: 5000},
			{res: resNothing, wantAction: pollLater, wantWait: 8 * time.Millisecond, wantClaim: 5000},
			{res: resNothing, wantAction: pollLater, wantWait: 16 * time.Millisecond, wantClaim: 5000},
			{res: resNothing, wantAction: pollLater, wantWait: 32 * time.Millisecond, wantClaim: 5000},
			{res: resNothing, wantAction: pollLater, wantWait: 64 * time.Millisecond, wantClaim: 5000},
			{res: resNothing, wantAction: pollLater, wantWait: 128 * time.Millisecond, wantClaim: 5000},
			{res: resNothing, wantAction: pollLater, wantWait: 256 * time.Millisecond, wantClaim: 5000},
			{res: resNothing, wantAction: pollLater, wantWait: 512 * time.Millisecond, wantClaim: 5000},
			{res: resNothing, wantAction: pollLater, wantWait: time.Second, wantClaim: 5000, description: "1024ms is past PollInterval: idle"},
			{res: resNothing, wantAction: pollLater, wantWait: time.Second, wantClaim: 5000, description: "idle stays idle"},
			{res: resFound, wantAction: pollLater, wantWait: 2 * time.Millisecond, wantClaim: 5000, description: "rows again: busy again"},
		},
		"a failure leaves the busy interval where it was": {
			{res: resFound, wantAction: pollLater, wantWait: 2 * time.Millisecond, wantClaim: 5000},
			{failed: true, wantWait: 100 * time.Millisecond, jittered: true, wantClaim: 5000},
			{res: resNothing, wantAction: pollLater, wantWait: 4 * time.Millisecond, wantClaim: 5000},
		},
		"futile claims probe with 100 rows, backing off 5ms doubling to 100ms": {
			{res: resBehind, wantAction: probeLater, wantWait: 5 * time.Millisecond, jittered: true, wantClaim: 100},
			{res: resBehind, wantAction: probeLater, wantWait: 10 * time.Millisecond, jittered: true, wantClaim: 100},
			{res: resBehind, wantAction: probeLater, wantWait: 20 * time.Millisecond, jittered: true, wantClaim: 100},
			{res: resBehind, wantAction: probeLater, wantWait: 40 * time.Millisecond, jittered: true, wantClaim: 100},
			{res: resBehind, wantAction: probeLater, wantWait: 80 * time.Millisecond, jittered: true, wantClaim: 100},
			{res: resBehind, wantAction: probeLater, wantWait: 100 * time.Millisecond, jittered: true, wantClaim: 100},
			{res: resBehind, wantAction: probeLater, wantWait: 100 * time.Millisecond, jittered: true, wantClaim: 100},
			{res: resNothing, wantAction: pollLater, wantWait: time.Second, wantClaim: 100, description: "an empty claim ends no probing"},
			{failed: true, wantWait: 100 * time.Millisecond, jittered: true, wantClaim: 100, description: "nor does a failure"},
			{res: resFound, wantAction: pollLater, wantWait: 2 * time.Millisecond, wantClaim: 5000, description: "a claim of its own does"},
			{res: resBehind, wantAction: probeLater, wantWait: 5 * time.Millisecond, jittered: true, wantClaim: 100, description: "and the backoff starts over"},
		},
		"a full batch, or one already claimed behind it, loops at once": {
			{res: resFull, full: true, wantAction: claimNow, wantClaim: 5000},
			{res: resFound, next: true, wantAction: claimNow, wantClaim: 5000},
			{res: resNothing, full: true, wantAction: pollLater, wantWait: 4 * time.Millisecond, wantClaim: 5000, description: "full of locked rows, none its own: not full of work"},
			{res: resBehind, full: true, wantAction: probeLater, wantWait: 5 * time.Millisecond, jittered: true, wantClaim: 100},
			{res: resFound, full: true, wantAction: claimNow, wantClaim: 5000},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := testPacer()
			require.Equal(t, 5000, p.claimSize())
			for i, o := range seq {
				step := fmt.Sprintf("step %d %s", i, o.description)
				var (
					act  action
					wait time.Duration
				)
				if o.failed {
					var attempt int
					attempt, wait = p.afterError()
					require.Positive(t, attempt, step)
				} else {
					act, wait = p.afterBatch(o.res, o.full, o.next)
					require.Equal(t, o.wantAction, act, step)
				}
				if o.jittered {
					require.GreaterOrEqual(t, wait, o.wantWait/2, step)
					require.LessOrEqual(t, wait, o.wantWait, step)
				} else {
					require.Equal(t, o.wantWait, wait, step)
				}
				require.Equal(t, o.wantClaim, p.claimSize(), step)
			}
		})
	}
}

// The attempt numbers Run logs count the failures in a row.
func TestPacerCountsFailuresInARow(t *testing.T) {
	t.Parallel()
	p := testPacer()
	for want := 1; want <= 3; want++ {
		attempt, _ := p.afterError()
		require.Equal(t, want, attempt)
	}
	p.afterBatch(resFound, false, false)
	attempt, _ := p.afterError()
	require.Equal(t, 1, attempt)
}

// With BusyPollInterval off (negative after New), an idle relayer only
// polls; and a batch size under the probe size caps the probe.
func TestPacerBusyPollingOffAndSmallBatches(t *testing.T) {
	t.Parallel()
	p := newPacer(Config{Common: Common{BatchSize: 20, BackoffMin: time.Millisecond, BackoffMax: time.Millisecond}, PollInterval: 50 * time.Millisecond, BusyPollInterval: -1})
	act, wait := p.afterBatch(resFound, false, false)
	require.Equal(t, pollLater, act)
	require.Equal(t, 50*time.Millisecond, wait)
	act, _ = p.afterBatch(resBehind, false, false)
	require.Equal(t, probeLater, act)
	require.Equal(t, 20, p.claimSize())
}
