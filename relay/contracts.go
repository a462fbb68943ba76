package relay

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/clip"
)

// CheckContract checks m's payload against its type's contract in c
// (Common.Contracts), as every source does for each event it is about to
// send, after its headers are decoded and its topic routed. It returns
// nil when the event may be sent: c is nil, the type has no contract (and
// none is required), or the payload follows the version its
// event_version header names (outbox.HeaderEventVersion), or the type's
// latest when it has none. Otherwise it returns a permanent error with
// ReasonContract that names the contract, the JSON pointer and the rule
// (a *contracts.Violation is wrapped), and the source refuses the event
// before sending it, as it refuses an undecodable one.
//
// An event that passes without an event_version header gets one in
// m.Headers: the version it was checked against, so that consumers can
// pick an upcaster by it whether the event came from Emit (which writes
// the header itself) or from a plain INSERT. The header is added here, in
// the relay, rather than by each sink as it writes its own headers, so
// that every sink sees it among the event's headers (and in
// Message.CloudEvent, whose dataschema it names): each sink already
// sizes and writes Message.Headers, so its check of the broker's limit
// before sending (kafkapub's record size, the other sinks' own) counts
// the header, and an event that no longer fits is held too_large rather
// than refused by the broker. The header costs at most
// len("event_version") plus the version's digits and framing, under 20
// bytes on the wire; Emit, which checked the same contracts, wrote it
// already and counted it, so only rows that reached the table without it
// grow. MaxBatchBytes counts events as read from the table, without it.
//
// A header that is not a version (a positive decimal, as Emit writes it:
// "2", not "v2", "02" or "0") is refused when the type has a contract,
// and left alone when it has none: rows of types without a contract pass
// unchanged, whatever their headers say.
func CheckContract(c outbox.Contracts, m *Message) error {
	if c == nil {
		return nil
	}
	raw, has := m.Headers[outbox.HeaderEventVersion]
	version := 0
	if has {
		n, ok := parseVersion(raw)
		if !ok {
			// Is the type under contract at all? Check says so by the
			// version it returns; the payload's verdict is not wanted.
			v, err := c.Check(m.Type, 0, m.Payload)
			switch {
			case v == 0 && err == nil:
				return nil
			case v == 0:
				return contractError(err)
			}
			return PermanentReason(ReasonContract, fmt.Errorf("header %s is %q, not a version of the type's contract (a decimal from 1, as Emit writes it); fix the row's header (or remove it to check against the latest version), then retry the event",
				outbox.HeaderEventVersion, clip.Text(raw, 40)))
		}
		version = n
	}
	v, err := c.Check(m.Type, version, m.Payload)
	if err != nil {
		return contractError(err)
	}
	if v != 0 && !has {
		if m.Headers == nil {
			m.Headers = make(map[string]string, 1)
		}
		m.Headers[outbox.HeaderEventVersion] = strconv.Itoa(v)
	}
	return nil
}

// contractError is err (from outbox.Contracts.Check) as the event's
// permanent failure.
func contractError(err error) error {
	return PermanentReason(ReasonContract, fmt.Errorf("%w; fix the row or the contracts, then retry the event (the relay reads the contracts when it starts)", err))
}

// parseVersion reads a version as Emit writes it: a decimal from 1, with
// no sign and no leading zero.
func parseVersion(s string) (int, bool) {
	if s == "" || s[0] < '1' || s[0] > '9' || len(s) > 9 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, true
}

// checksPerWorker is the fewest events CheckContracts gives a goroutine
// of its own: below it, starting one costs more than it saves.
const checksPerWorker = 64

// CheckContracts runs CheckContract on each msgs[i] whose refuse[i] is
// nil (the source has not refused it already), setting refuse[i] to its
// error; both sources check each batch with it before sending it. A
// large batch is split over GOMAXPROCS goroutines: a check is a JSON
// Schema validation, tens of microseconds for a payload of a kilobyte,
// which one goroutine would add up to the better part of a second per
// batch of 5,000.
func CheckContracts(c outbox.Contracts, msgs []Message, refuse []error) {
	if c == nil {
		return
	}
	check := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			if refuse[i] == nil {
				refuse[i] = CheckContract(c, &msgs[i])
			}
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(msgs)/checksPerWorker)
	if workers <= 1 {
		check(0, len(msgs))
		return
	}
	var wg sync.WaitGroup
	chunk := (len(msgs) + workers - 1) / workers
	for lo := 0; lo < len(msgs); lo += chunk {
		wg.Go(func() { check(lo, min(lo+chunk, len(msgs))) })
	}
	wg.Wait()
}
