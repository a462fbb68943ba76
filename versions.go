package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// VersionedPayload is one version of an event that EmitVersions writes.
type VersionedPayload struct {
	// Version is the version of the type's contract Payload follows: 1 or
	// more (EmitVersions has no "latest").
	Version int
	// Payload is the body in that version's shape, taken as Event.Payload
	// is.
	Payload any
}

// EmitVersions writes one logical event in several versions of its
// type's contract, for the time a contract migrates (a dual emit): one
// row per version, in ascending version order, with ev's aggregate, type
// and headers, in tx, and returns their ids in the order of versions.
// Each row carries its own event_version header and the event_versions
// header listing every version written (HeaderEventVersions, e.g. "1,2"),
// by which a consumer that reads one version applies the logical event
// once (consumer.Upcasters.Want). A consumer that reads every row sees
// the event once per version.
//
// ev.Payload and ev.Version must be left zero: each version brings its
// own. versions must be ascending, each at least 1. Every row is
// validated first, each payload against its version's contract when
// Config.Contracts is set: on an error nothing is sent and tx is
// untouched. The rows are one statement, as EmitBatch writes them.
func (p *Producer) EmitVersions(ctx context.Context, tx pgx.Tx, ev Event, versions ...VersionedPayload) ([]int64, error) {
	events, list, err := versionedEvents(ev, versions)
	if err != nil {
		return nil, err
	}
	return p.emitBatch(ctx, tx, events, list)
}

// EmitVersionsSQL is EmitVersions for a database/sql transaction.
func (p *Producer) EmitVersionsSQL(ctx context.Context, tx *sql.Tx, ev Event, versions ...VersionedPayload) ([]int64, error) {
	events, list, err := versionedEvents(ev, versions)
	if err != nil {
		return nil, err
	}
	return p.emitBatchSQL(ctx, tx, events, list)
}

// EmitVersions writes ev in several versions into public.events_outbox
// within tx, with the default Config. See Producer.EmitVersions.
func EmitVersions(ctx context.Context, tx pgx.Tx, ev Event, versions ...VersionedPayload) ([]int64, error) {
	return defaultProducer.EmitVersions(ctx, tx, ev, versions...)
}

// EmitVersionsSQL is EmitVersions for a database/sql transaction.
func EmitVersionsSQL(ctx context.Context, tx *sql.Tx, ev Event, versions ...VersionedPayload) ([]int64, error) {
	return defaultProducer.EmitVersionsSQL(ctx, tx, ev, versions...)
}

// versionedEvents checks the shape of a dual emit and returns its rows'
// events and the event_versions header they share.
func versionedEvents(ev Event, versions []VersionedPayload) ([]Event, string, error) {
	if len(versions) == 0 {
		return nil, "", fmt.Errorf("%w: EmitVersions was given no versions; pass one VersionedPayload per version to write", ErrEmptyBatch)
	}
	if ev.Payload != nil || ev.Version != 0 {
		return nil, "", fmt.Errorf("%w (type %s): EmitVersions takes each payload and version from its VersionedPayload; leave Event.Payload and Event.Version zero", ErrInvalidPayload, quoteShort(ev.Type))
	}
	list := make([]string, len(versions))
	events := make([]Event, len(versions))
	for i, v := range versions {
		if v.Version < 1 {
			return nil, "", fmt.Errorf("%w (type %s): versions[%d].Version is %d; name each version, from 1", ErrContractViolation, quoteShort(ev.Type), i, v.Version)
		}
		if i > 0 && v.Version <= versions[i-1].Version {
			return nil, "", fmt.Errorf("%w (type %s): versions[%d].Version is %d after %d; list each version once, in ascending order", ErrContractViolation, quoteShort(ev.Type), i, v.Version, versions[i-1].Version)
		}
		list[i] = strconv.Itoa(v.Version)
		events[i] = ev
		events[i].Version, events[i].Payload = v.Version, v.Payload
	}
	return events, strings.Join(list, ","), nil
}
