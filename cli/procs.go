package cli

import (
	"context"
	"fmt"
	"runtime"
	"strconv"

	"github.com/pgoutbox/outbox/internal/procs"
	"github.com/pgoutbox/outbox/relay"
)

// procsAuto, procsAll: the words --procs takes besides a number.
const (
	procsAuto = "auto"
	procsAll  = "all"
)

// checkProcs refuses a --procs that is neither a word it knows nor a
// positive number.
func (o *relayOptions) checkProcs() error {
	switch o.procs {
	case procsAuto, procsAll:
		return nil
	}
	if n, err := strconv.Atoi(o.procs); err != nil || n < 1 {
		return fmt.Errorf("--procs %q: use auto (one thread at a trickle, all while a backlog drains), all (GOMAXPROCS or every CPU), or a number of threads such as 1", o.procs)
	}
	return nil
}

// startProcs applies --procs to the running source src; the returned stop
// ends the adaptation.
func (o *relayOptions) startProcs(ctx context.Context, src relay.Source, common relay.Common) (stop func()) {
	switch o.procs {
	case procsAll:
		return func() {}
	case procsAuto:
		return procs.Start(ctx, procs.Config{
			Sample:    func() (int64, int64) { s := src.Stats(); return s.Batches, s.Claimed },
			BatchSize: common.WithDefaults().BatchSize,
			Logger:    common.Logger,
		})
	}
	n, _ := strconv.Atoi(o.procs) // checkProcs let only numbers through
	runtime.GOMAXPROCS(n)
	return func() {}
}
