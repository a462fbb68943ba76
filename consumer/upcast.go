package consumer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/clip"
)

// Upcaster turns a payload of one version of an event type's contract into
// the next version's. It must not modify its argument. An error
// dead-letters the event (a retry would fail the same way).
type Upcaster func(payload json.RawMessage) (json.RawMessage, error)

// Upcasters holds, per event type, the steps that turn each version of its
// contract into the next, so that a handler reads one version however old
// the events it is given: Want makes the middleware that upcasts. The zero
// value is empty and ready to use, and it is safe for concurrent use; a
// nil *Upcasters has no steps.
//
// Versions come from the event_version header (outbox.HeaderEventVersion).
// An event without one is read as version 1: the shape the type had before
// anyone numbered it.
type Upcasters struct {
	mu    sync.RWMutex
	steps map[string]map[int]Upcaster
}

// Register adds the step that turns version from of eventType into version
// from+1. A step registered twice, a version below 1, an empty type or a
// nil fn is refused.
func (u *Upcasters) Register(eventType string, from int, fn Upcaster) error {
	switch {
	case eventType == "":
		return errors.New("consumer: Upcasters.Register: the event type is empty; name the type the step upcasts, e.g. \"order.placed\"")
	case from < 1:
		return fmt.Errorf("consumer: Upcasters.Register(%q, %d): versions start at 1; from is the version the step reads, and it writes from+1", eventType, from)
	case fn == nil:
		return fmt.Errorf("consumer: Upcasters.Register(%q, %d): the upcaster is nil", eventType, from)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, dup := u.steps[eventType][from]; dup {
		return fmt.Errorf("consumer: Upcasters.Register(%q, %d): a step from version %d to %d is already registered; register each step once", eventType, from, from, from+1)
	}
	if u.steps == nil {
		u.steps = map[string]map[int]Upcaster{}
	}
	if u.steps[eventType] == nil {
		u.steps[eventType] = map[int]Upcaster{}
	}
	u.steps[eventType][from] = fn
	return nil
}

func (u *Upcasters) step(eventType string, from int) Upcaster {
	if u == nil {
		return nil
	}
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.steps[eventType][from]
}

// Want returns the middleware by which a handler of eventType reads version
// version of its contract, and only that version. Events of other types
// pass through unchanged, so one Want per type can sit in a consumer's
// Middleware, or wrap one handler:
//
//	Handlers: map[string]consumer.Handler{"order.placed": ups.Want("order.placed", 2)(handle)}
//
// An event of an older version is upcast step by step (v1 -> v2 -> v3)
// before the handler runs, which sees Version and Payload in the version
// it wants and OriginalPayload as delivered. A missing step, a step that
// fails or returns invalid JSON, an event newer than version, or a bad
// event_version or event_versions header fails with a Permanent error
// that says what to do: the event is dead-lettered, never retried.
//
// An event written in several versions at once (outbox.EmitVersions: its
// event_versions header lists them) is applied once, from one row: the
// row of version, or else of the highest listed version below it, or
// else of the lowest listed. The handler does not run for the other rows;
// they are still acknowledged, and recorded in the processed table, so
// that a redelivery is a Duplicate. Consumers without Want see every row.
//
// Want panics when version is below 1.
func (u *Upcasters) Want(eventType string, version int) Middleware {
	if version < 1 {
		panic(fmt.Sprintf("consumer: Upcasters.Want(%q, %d): versions start at 1", eventType, version))
	}
	return func(next Handler) Handler {
		return func(ctx context.Context, tx pgx.Tx, ev Event) error {
			if ev.Type != eventType {
				return next(ctx, tx, ev)
			}
			ev, skip, err := u.upcast(ev, version)
			if err != nil {
				return Permanent(err)
			}
			if skip {
				return nil
			}
			return next(ctx, tx, ev)
		}
	}
}

// upcast returns ev in version want, or skip when another row of its dual
// emit is the one to apply.
func (u *Upcasters) upcast(ev Event, want int) (_ Event, skip bool, _ error) {
	from := 1
	if raw, ok := ev.Headers[outbox.HeaderEventVersion]; ok {
		v, err := parseVersion(raw)
		if err != nil {
			return ev, false, fmt.Errorf("event %d of type %q: %s header %q is not a positive decimal integer; the producer must write the number of the contract version the payload follows there", ev.ID, ev.Type, outbox.HeaderEventVersion, clip.Text(raw, 64))
		}
		from = v
	}
	if raw, ok := ev.Headers[outbox.HeaderEventVersions]; ok {
		apply, err := pickVersion(raw, from, want)
		if err != nil {
			return ev, false, fmt.Errorf("event %d of type %q: %w", ev.ID, ev.Type, err)
		}
		if apply != from {
			return ev, true, nil
		}
	}
	if from > want {
		return ev, false, fmt.Errorf("event %d of type %q is version %d, newer than version %d, which this handler reads; deploy a consumer that reads version %d, or have the producer emit version %d beside it (outbox.EmitVersions) until every consumer reads the new one, then replay the event from the dead-letter place", ev.ID, ev.Type, from, want, from, want)
	}
	payload := json.RawMessage(bytes.Clone(ev.Payload))
	for v := from; v < want; v++ {
		fn := u.step(ev.Type, v)
		if fn == nil {
			return ev, false, fmt.Errorf("event %d of type %q is version %d, and there is no upcaster from version %d to %d to read it as version %d; register one (Upcasters.Register(%q, %d, fn)), then replay the event from the dead-letter place", ev.ID, ev.Type, from, v, v+1, want, ev.Type, v)
		}
		out, err := fn(payload)
		if err != nil {
			return ev, false, fmt.Errorf("upcast event %d of type %q from version %d to %d: %w; fix the upcaster (or the event), then replay the event from the dead-letter place", ev.ID, ev.Type, v, v+1, err)
		}
		if !json.Valid(out) {
			return ev, false, fmt.Errorf("upcast event %d of type %q from version %d to %d: the upcaster returned %d bytes that are not valid JSON; fix the upcaster, then replay the event from the dead-letter place", ev.ID, ev.Type, v, v+1, len(out))
		}
		payload = out
	}
	if from < want {
		ev.OriginalPayload, ev.Payload = ev.Payload, payload
	}
	ev.Version = want
	return ev, false, nil
}

// pickVersion reads an event_versions list and returns the version whose
// row a handler of version want applies: want itself, or the highest
// listed below it, or the lowest listed (which will be too new for it).
// own, the row's version, must be listed.
func pickVersion(list string, own, want int) (int, error) {
	bad := func(why string) (int, error) {
		return 0, fmt.Errorf("%s header %q %s; the producer must list the versions it emitted together, ascending, e.g. \"1,2\" (outbox.EmitVersions writes it)", outbox.HeaderEventVersions, clip.Text(list, 64), why)
	}
	pick, prev, listed := 0, 0, false
	for _, f := range strings.Split(list, ",") {
		v, err := parseVersion(f)
		if err != nil {
			return bad("holds " + strconv.Quote(clip.Text(f, 24)) + ", not a positive decimal integer")
		}
		if v <= prev {
			return bad("is not ascending")
		}
		prev = v
		listed = listed || v == own
		if pick == 0 || v <= want {
			pick = v
		}
	}
	if !listed {
		return bad(fmt.Sprintf("does not list the event's own version %d", own))
	}
	return pick, nil
}

// parseVersion accepts a version as the producer writes it: a positive
// decimal, digits only, that fits an int32.
func parseVersion(s string) (int, error) {
	if s == "" || len(s) > 10 || strings.Trim(s, "0123456789") != "" {
		return 0, errors.New("not a positive decimal integer")
	}
	v, err := strconv.ParseInt(s, 10, 32)
	if err != nil || v <= 0 {
		return 0, errors.New("not a positive decimal integer")
	}
	return int(v), nil
}
