package consumer

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
)

// CheckContracts returns the middleware that checks each event's payload
// against its type's contract (*contracts.Set implements outbox.Contracts)
// before the handler runs: against ev.Version, the version the handler is
// given, or the type's latest when the event carries none. A payload that
// breaks it, names a version the contract lacks, or (when the contracts
// require one) has no contract is a Permanent error naming the JSON
// pointer and the rule: the event is dead-lettered, never retried. Events
// of types without a contract pass unchecked.
//
// A payload that is not JSON (a binary content type, outbox.Bytes) of a
// type with a contract breaks it, as Emit refuses it.
//
// Put it inside Upcasters.Want, so it checks the shape the handler reads:
//
//	Middleware: []consumer.Middleware{ups.Want("order.placed", 2), consumer.CheckContracts(set)}
func CheckContracts(c outbox.Contracts) Middleware {
	if c == nil {
		panic("consumer: CheckContracts(nil): pass the contracts to check against (contracts.Load)")
	}
	return func(next Handler) Handler {
		return func(ctx context.Context, tx pgx.Tx, ev Event) error {
			if _, err := c.Check(ev.Type, max(ev.Version, 0), ev.Payload); err != nil {
				return Permanent(fmt.Errorf("event %d of type %q breaks its contract: %w; fix the producer (or the contract), then replay the event from the dead-letter place", ev.ID, ev.Type, err))
			}
			return next(ctx, tx, ev)
		}
	}
}
