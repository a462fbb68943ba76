package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgoutbox/outbox/internal/cputime"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// preloadRangeSQL is preloadSQL for the events numbered $1 to $2, so that a
// backlog written as many transactions spreads over the aggregates as one
// INSERT does.
const preloadRangeSQL = `INSERT INTO %s (aggregate_id, type, payload, created_at)
SELECT md5('aggregate-' || (g %% $3))::uuid, 'order.placed',
  jsonb_build_object('order_id', g, 'customer_id', 'customer-' || (g %% $3), 'total_cents', (g::bigint * 7919) %% 100000,
    'currency', 'EUR', 'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (g %% 97), 'qty', 1 + g %% 5, 'price_cents', 1999))),
  now()
FROM generate_series($1::bigint, $2::bigint) g`

// createSlotSQL creates a second slot on the outbox's publication, for
// pg_recvlogical to read the same backlog as the relayer's.
const createSlotSQL = `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`

// dropSlotSQL drops it, if it is there.
const dropSlotSQL = `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`

// preloadTxs writes n pending events in transactions of perTx events, one
// after the other, as producers would have while the relay was stopped.
func (e *env) preloadTxs(ctx context.Context, n, perTx, aggregates int) error {
	sql := fmt.Sprintf(preloadRangeSQL, e.tables.OutboxIdent())
	for from := 1; from <= n; from += perTx {
		if err := e.exec(ctx, sql, from, min(from+perTx-1, n), aggregates); err != nil {
			return fmt.Errorf("preload events %d to %d: %w", from, min(from+perTx-1, n), err)
		}
	}
	return nil
}

// backlog is a shape of the preloaded events the drains read.
type backlog struct {
	key, name string
	perTx     int // events per transaction; 0: one INSERT
}

func walBacklogs(n int64) []backlog {
	return []backlog{
		{name: "one INSERT of " + thousands(n)},
		{key: "small", name: fmt.Sprintf("%s transactions of 100", thousands((n+99)/100)), perTx: 100},
	}
}

// backlogDrains is what each source made of one backlog; recv is zero
// when pg_recvlogical did not run.
type backlogDrains struct {
	poll, wal, recv drainResult
}

// walDrain drains each backlog with pg_recvlogical (the decoding limit),
// the WAL source and the polling relay.
func walDrain(ctx context.Context, s *session, e *env, res *Result, n int64, recv string, recvErr error) error {
	t := Table{Title: fmt.Sprintf("drain %s preloaded events", thousands(n)),
		Columns: []string{"backlog", "source", "events/s", "seconds", "batches", "records on broker", "vs poll", "vs pg_recvlogical", "walsender CPU s", "reader CPU s"}}
	for _, bl := range walBacklogs(n) {
		d, err := drainBacklog(ctx, s, e, bl, n, recv)
		if err != nil {
			return fmt.Errorf("%s: %w", bl.name, err)
		}
		key := "wal.drain."
		if bl.key != "" {
			key += bl.key + "."
		}
		recvRate := d.recv.rate()
		if recvErr == nil {
			t.Rows = append(t.Rows, []string{bl.name, "pg_recvlogical (same slot options, output to /dev/null)", rate(recvRate), fmt.Sprintf("%.2f", d.recv.elapsed.Seconds()), "-", "-", ratio(recvRate / d.poll.rate()), "1.00x",
				cpuSeconds(d.recv.serverCPU), cpuSeconds(d.recv.clientCPU)})
			res.metric(key+"recvlogical.walsender_cpu_s", d.recv.serverCPU.Seconds())
			res.metric(key+"recvlogical.reader_cpu_s", d.recv.clientCPU.Seconds())
			res.metric(key+"recvlogical.events_per_s", recvRate)
			res.metric(key+"wal_vs_recvlogical", d.wal.rate()/recvRate)
		} else {
			t.Rows = append(t.Rows, []string{bl.name, "pg_recvlogical", "not run: " + recvErr.Error(), "-", "-", "-", "-", "-", "-", "-"})
		}
		for _, r := range []struct {
			key, name string
			d         drainResult
		}{{"wal", "WAL source (pgoutput slot, no UPDATE; reader CPU: relayer + dev broker)", d.wal}, {"poll", "polling relay (claim, publish, UPDATE dispatched_at; reader CPU: relayer + dev broker)", d.poll}} {
			vsRecv := "-"
			if recvErr == nil {
				vsRecv = ratio(r.d.rate() / recvRate)
			}
			t.Rows = append(t.Rows, []string{bl.name, r.name, rate(r.d.rate()), fmt.Sprintf("%.2f", r.d.elapsed.Seconds()), thousands(r.d.batches), thousands(r.d.published), ratio(r.d.rate() / d.poll.rate()), vsRecv,
				cpuSeconds(r.d.serverCPU), cpuSeconds(r.d.clientCPU)})
			res.metric(key+r.key+".reader_cpu_s", r.d.clientCPU.Seconds())
			if r.d.serverCPU > 0 {
				res.metric(key+r.key+".walsender_cpu_s", r.d.serverCPU.Seconds())
			}
			res.metric(key+r.key+".events_per_s", r.d.rate())
			res.metric(key+r.key+".published", float64(r.d.published))
		}
		res.metric(key+"ratio", d.wal.rate()/d.poll.rate())
	}
	res.Tables = append(res.Tables, t)
	return nil
}

// drainBacklog writes the backlog once, after creating the relayer's slot
// and, when pg_recvlogical is there, a second one, then drains it with
// pg_recvlogical from the second slot, with the WAL relayer from the
// first, and with the polling relay from the table (the WAL source leaves
// the rows pending).
func drainBacklog(ctx context.Context, s *session, e *env, bl backlog, n int64, recv string) (d backlogDrains, err error) {
	if err := e.exec(ctx, "TRUNCATE "+e.tables.OutboxIdent()+" RESTART IDENTITY"); err != nil {
		return d, err
	}
	slot, err := e.setupSlot(ctx)
	if err != nil {
		return d, err
	}
	defer func() { err = errors.Join(err, e.teardownSlot(context.WithoutCancel(ctx), slot)) }()
	recvSlot := slot + "_recv"
	if recv != "" {
		if err := e.exec(ctx, createSlotSQL, recvSlot); err != nil {
			return d, fmt.Errorf("create slot %s: %w", recvSlot, err)
		}
		defer func() { err = errors.Join(err, e.exec(context.WithoutCancel(ctx), dropSlotSQL, recvSlot)) }()
	}
	s.progress("wal: preloading %s", bl.name)
	if bl.perTx == 0 {
		err = e.preload(ctx, int(n), s.cfg.Aggregates)
	} else {
		err = e.preloadTxs(ctx, int(n), bl.perTx, s.cfg.Aggregates)
	}
	if err != nil {
		return d, err
	}
	if err := e.vacuum(ctx); err != nil {
		return d, err
	}
	if recv != "" {
		s.progress("wal: pg_recvlogical reading %s", bl.name)
		if d.recv, err = drainRecvlogical(ctx, s, e, recv, recvSlot, n); err != nil {
			return d, fmt.Errorf("pg_recvlogical: %w", err)
		}
		if err := e.exec(ctx, dropSlotSQL, recvSlot); err != nil {
			return d, err
		}
	}
	s.progress("wal: WAL relay draining %s", bl.name)
	if d.wal, err = drainWAL(ctx, s, e, n); err != nil {
		return d, fmt.Errorf("wal drain: %w", err)
	}
	if err := e.teardownSlot(ctx, slot); err != nil {
		return d, err
	}
	s.progress("wal: polling relay draining %s", bl.name)
	e.checkpoint(ctx)
	b, err := s.startBroker()
	if err != nil {
		return d, err
	}
	defer b.close()
	cpu0 := cputime.Self()
	if d.poll, err = e.drainWithRelayers(ctx, b, 1, n, nil); err != nil {
		return d, fmt.Errorf("poll drain: %w", err)
	}
	d.poll.clientCPU = cputime.Self() - cpu0
	return d, nil
}

// drainRecvlogical reads the slot with pg_recvlogical up to the current
// WAL position and times it from start to exit.
func drainRecvlogical(ctx context.Context, s *session, e *env, recv, slot string, n int64) (drainResult, error) {
	e.checkpoint(ctx)
	end, err := e.intQuery(ctx, walInsertLSNSQL)
	if err != nil {
		return drainResult{}, err
	}
	watch := e.watchWalsender(ctx, slot)
	rl, err := startRecvlogical(ctx, recv, s.cfg.DatabaseURL, slot, walrelay.DefaultNameOf(e.pool, e.tables), lsnString(end))
	if err != nil {
		watch.stop(ctx, e, slot)
		return drainResult{}, err
	}
	elapsed, err := rl.wait(ctx, drainTimeout(n))
	server := watch.stop(ctx, e, slot)
	if err != nil {
		return drainResult{}, err
	}
	client := rl.cmd.ProcessState.UserTime() + rl.cmd.ProcessState.SystemTime()
	return drainResult{events: n, elapsed: elapsed, serverCPU: server, clientCPU: client}, nil
}

// drainWAL drains the n events already in the env's slot with one WAL
// relayer to a fresh broker, timed from the relayer's start to the last
// event's broker ack.
func drainWAL(ctx context.Context, s *session, e *env, n int64) (d drainResult, err error) {
	e.checkpoint(ctx)
	b, err := s.startBroker()
	if err != nil {
		return d, err
	}
	defer b.close()
	prefix := fmt.Sprintf("bench%s_%s_", e.id, randomID())
	slot := walrelay.DefaultNameOf(e.pool, e.tables)
	watch := e.watchWalsender(ctx, slot)
	cpu0 := cputime.Self()
	w, err := e.startWAL(ctx, b, prefix, 0, nil)
	if err != nil {
		watch.stop(ctx, e, slot)
		return d, err
	}
	elapsed, werr := w.waitFor(ctx, n, drainTimeout(n))
	client := cputime.Self() - cpu0
	server := watch.stop(ctx, e, slot)
	st := w.r.Stats()
	if err := errors.Join(werr, w.stop()); err != nil {
		return d, err
	}
	d = drainResult{events: st.Dispatched, elapsed: elapsed, batches: st.Batches, serverCPU: server, clientCPU: client}
	if d.published, err = b.published(ctx, prefix+"order"); err != nil {
		return d, err
	}
	if d.published < n {
		return d, fmt.Errorf("broker holds %d records; want %d", d.published, n)
	}
	return d, nil
}
