package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pgoutbox/outbox/relay"
)

// bareClaimSQL is the ceiling a relay chases: claim and mark 1,000 pending
// rows in id order in one statement, with no ordering rule, no payload
// fetched and no broker.
const bareClaimSQL = `UPDATE %[1]s SET dispatched_at = now() WHERE id IN (
  SELECT id FROM %[1]s WHERE dispatched_at IS NULL ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED)`

// bareReturningSQL is the same, returning the rows a relay has to publish:
// the difference to bareClaimSQL is the cost of reading them out.
const bareReturningSQL = bareClaimSQL + `
RETURNING id, aggregate_id, type, payload, headers, created_at`

// drainer is one way to drain the preload, run once per round.
type drainer struct {
	key, name string
	// relay marks the outbox relayer with its defaults at the default
	// aggregate spread: the rows the target is judged on.
	relay bool
	run   func() (drainResult, error)
}

func runRelay(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	n := int64(cfg.Events)
	rounds := pick(cfg.Short, 1, 3)
	e, err := s.newEnv(ctx, "relay", 4)
	if err != nil {
		return nil, err
	}
	defer e.close()
	claimSQL, err := captureClaimSQL(ctx, e)
	if err != nil {
		return nil, err
	}

	res := &Result{}
	res.param("preload", "%s pending events over %s aggregates unless the row says otherwise, round-robin (INSERT ... SELECT generate_series, VACUUM ANALYZE, CHECKPOINT), fresh for every drain", thousands(n), thousands(int64(cfg.Aggregates)))
	res.param("relay", "relay.New with defaults (batch 5,000, 4 MiB, per-aggregate order on, pipelining) + kafkapub.Publisher; each relayer has its own pool and Kafka client")
	res.param("bare SQL", "one client, no broker, no ordering rule: UPDATE ... WHERE id IN (SELECT id ... ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED) until no row is left")
	res.param("timing", "from start to the commit of the batch that dispatched the last event; %d rounds, drainers interleaved, the median round is reported", rounds)

	drainers := relayDrainers(ctx, s, e, n, claimSQL)
	results, err := drainRounds(s, drainers, rounds)
	if err != nil {
		return nil, err
	}
	relayTable(res, drainers, results, n)

	if cfg.Watermill {
		if err := relayVsWatermill(ctx, s, e, res, n, rounds); err != nil {
			return res, err
		}
	} else {
		res.note("add --watermill to drain the same preload with the Watermill forwarder (bench/watermill) and report outbox / Watermill")
	}
	return res, nil
}

// relayDrainers lists the drainers a round runs, the bare SQL ceiling
// first: the others are measured against it.
func relayDrainers(ctx context.Context, s *session, e *env, n int64, claimSQL string) []drainer {
	cfg := s.cfg
	table := e.tables.OutboxIdent()
	aggs := cfg.Aggregates
	bare := func(stmt string, args ...any) func() (drainResult, error) {
		return func() (drainResult, error) { return drainBare(ctx, s, e, n, stmt, args...) }
	}
	relayers := func(count, aggregates int, mod func(*relay.Config)) func() (drainResult, error) {
		return func() (drainResult, error) { return drainRelay(ctx, s, e, n, aggregates, count, mod) }
	}
	drainers := []drainer{
		{key: "bare", name: "bare SQL claim-and-mark (1 client)", run: bare(fmt.Sprintf(bareClaimSQL, table))},
		{key: "bare_returning", name: "bare SQL + RETURNING the rows (1 client)", run: bare(fmt.Sprintf(bareReturningSQL, table))},
		// The relayer's own statement, ordering rule included, run the
		// same way: the database's share of the relay's cost.
		{key: "claim_statement", name: "relay's claim statement alone (1 client, autocommit)", run: bare(claimSQL, 1000, []int64{}, 4<<20)},
		{key: "null_publisher", name: "outbox relay, 1 relayer, publisher that acks at once", run: func() (drainResult, error) { return drainNull(ctx, s, e, n) }},
		{key: "relayers_1", name: "outbox relay, 1 relayer", relay: true, run: relayers(1, aggs, nil)},
		{key: "relayers_2", name: "outbox relay, 2 relayers", relay: true, run: relayers(2, aggs, nil)},
		{key: "relayers_4", name: "outbox relay, 4 relayers", relay: true, run: relayers(4, aggs, nil)},
	}
	if !cfg.Short {
		// Replicas can only share a backlog whose aggregates they can split:
		// with every aggregate in every batch (the default preload), the
		// second relayer finds each aggregate's head locked by the first.
		spread := max(aggs, int(n/2))
		label := fmt.Sprintf(", %s aggregates", thousands(int64(spread)))
		for _, c := range []int{1, 2, 4} {
			drainers = append(drainers, drainer{key: fmt.Sprintf("spread_relayers_%d", c), name: fmt.Sprintf("outbox relay, %d relayer(s)%s", c, label), run: relayers(c, spread, nil)})
		}
		// The batch size default (5,000), measured against a smaller and a
		// larger one: per-batch costs (the walks over the pending index,
		// the commit's flush, the broker round trip) spread over more rows.
		for _, bs := range []int{1000, 10000} {
			mod := func(c *relay.Config) { c.BatchSize = bs }
			drainers = append(drainers,
				drainer{key: fmt.Sprintf("relayers_1_batch_%d", bs), name: fmt.Sprintf("outbox relay, 1 relayer, batch %s", thousands(int64(bs))), run: relayers(1, aggs, mod)},
				drainer{key: fmt.Sprintf("spread_relayers_1_batch_%d", bs), name: fmt.Sprintf("outbox relay, 1 relayer, batch %s%s", thousands(int64(bs)), label), run: relayers(1, spread, mod)},
			)
		}
	}
	return drainers
}

// drainRounds runs every drainer once per round, interleaved, and returns
// each drainer's results in round order.
func drainRounds(s *session, drainers []drainer, rounds int) ([][]drainResult, error) {
	results := make([][]drainResult, len(drainers))
	for round := range rounds {
		for i, d := range drainers {
			s.progress("relay: round %d/%d: %s", round+1, rounds, d.name)
			r, err := d.run()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", d.name, err)
			}
			results[i] = append(results[i], r)
		}
	}
	return results, nil
}

// relayTable reports each drainer's median round against the bare SQL
// ceiling (drainers[0]) and judges the best relay drainer on the target.
// It sorts each drainer's results by rate.
func relayTable(res *Result, drainers []drainer, results [][]drainResult, n int64) {
	medians := make([]drainResult, len(drainers))
	for i, rs := range results {
		slices.SortFunc(rs, func(a, b drainResult) int { return cmp.Compare(a.rate(), b.rate()) })
		medians[i] = rs[len(rs)/2]
	}
	bareRate := medians[0].rate()
	t := Table{Title: fmt.Sprintf("drain %s events", thousands(n)), Columns: []string{"drainer", "events/s", "seconds", "batches", "vs bare SQL", "spread of rounds"}}
	bestRate, bestName := -1.0, ""
	for i, d := range drainers {
		m := medians[i]
		lo, hi := results[i][0].rate(), results[i][len(results[i])-1].rate()
		t.Rows = append(t.Rows, []string{d.name, rate(m.rate()), fmt.Sprintf("%.2f", m.elapsed.Seconds()), thousands(m.batches), ratio(m.rate() / bareRate), rate(lo) + " - " + rate(hi)})
		res.metric("relay."+d.key+".events_per_s", m.rate())
		if m.published > 0 {
			res.metric("relay."+d.key+".dispatched", float64(m.events))
			res.metric("relay."+d.key+".published", float64(m.published))
		}
		if d.relay && m.rate() > bestRate {
			bestRate, bestName = m.rate(), d.name
		}
	}
	res.Tables = append(res.Tables, t)
	r := bestRate / bareRate
	res.metric("relay.ratio_bare", r)
	measured := fmt.Sprintf("%.2fx (%s: %s vs %s events/s)", r, bestName, rate(bestRate), rate(bareRate))
	if spread, ok := res.Metrics["relay.spread_relayers_2.events_per_s"]; ok {
		measured += fmt.Sprintf("; %.2fx with 2 relayers when aggregates do not repeat within a batch", spread/bareRate)
	}
	res.target("relay vs bare SQL", ">= 0.70x bare claim-and-mark, ordering on, default batch", measured, r >= 0.7)
}

// relayVsWatermill drains the same preload with one relayer and with the
// Watermill forwarder, and reports outbox / Watermill.
func relayVsWatermill(ctx context.Context, s *session, e *env, res *Result, n int64, rounds int) error {
	// Like for like at the size the published comparison used (50,000
	// events): Watermill's forwarder slows down as its table grows.
	wn := min(n, 50_000)
	var outs []float64
	for range rounds {
		d, err := drainRelay(ctx, s, e, wn, s.cfg.Aggregates, 1, nil)
		if err != nil {
			return fmt.Errorf("outbox relay on %d events: %w", wn, err)
		}
		outs = append(outs, d.rate())
	}
	out := median(outs)
	wm, err := s.runWatermill(ctx, wn)
	if err != nil {
		return fmt.Errorf("watermill: %w", err)
	}
	wmTable(res, wm, out)
	wr := out / wm.EventsPerS
	res.metric("relay.ratio_watermill", wr)
	res.target("relay vs Watermill", ">= 10x the Watermill forwarder (batch 1,000, 10 ms poll)", fmt.Sprintf("%.1fx (1 relayer %s vs %s events/s, %s events each)", wr, rate(out), rate(wm.EventsPerS), thousands(wn)), wr >= 10)
	return nil
}

// drainBare resets the table and drains it with one client running stmt
// until a statement finds nothing.
func drainBare(ctx context.Context, s *session, e *env, n int64, stmt string, args ...any) (drainResult, error) {
	if err := e.reset(ctx, int(n), s.cfg.Aggregates); err != nil {
		return drainResult{}, err
	}
	s.progress("relay: bare SQL drain of %d events", n)
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return drainResult{}, err
	}
	defer conn.Release()
	var d drainResult
	start := time.Now()
	for {
		rows, err := conn.Query(ctx, stmt, args...)
		if err != nil {
			return d, err
		}
		var got, seen int64
		for rows.Next() {
			seen++
			// Raw bytes, as the relayer scans its payloads: decoding
			// JSONB into Go maps here would charge the client's decoding
			// to the statement. The relayer's claim answers one row of
			// NULLs (with its locked count) when it claims nothing: not a
			// claimed row.
			if rows.RawValues()[0] != nil {
				got++
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return d, err
		}
		if seen == 0 { // an UPDATE without RETURNING: count what it marked
			got = rows.CommandTag().RowsAffected()
		}
		if got == 0 {
			break
		}
		d.events += got
		d.batches++
	}
	d.elapsed = time.Since(start)
	if pending, err := e.pending(ctx); err != nil || pending != 0 || d.events != n {
		return d, fmt.Errorf("marked %d of %d events, %d still pending (err %v)", d.events, n, pending, err)
	}
	return d, nil
}

// drainRelay resets the table and drains it with relayers to a fresh
// broker.
func drainRelay(ctx context.Context, s *session, e *env, n int64, aggregates, relayers int, mod func(*relay.Config)) (drainResult, error) {
	if err := e.reset(ctx, int(n), aggregates); err != nil {
		return drainResult{}, err
	}
	b, err := s.startBroker()
	if err != nil {
		return drainResult{}, err
	}
	defer b.close()
	s.progress("relay: %d relayer(s) draining %d events", relayers, n)
	return e.drainWithRelayers(ctx, b, relayers, n, mod)
}

// drainNull drains the table with one relayer whose publisher acknowledges
// at once: the relay's cost without the broker.
func drainNull(ctx context.Context, s *session, e *env, n int64) (drainResult, error) {
	if err := e.reset(ctx, int(n), s.cfg.Aggregates); err != nil {
		return drainResult{}, err
	}
	s.progress("relay: 1 relayer, no broker, draining %d events", n)
	g, err := e.startRelayers(ctx, nil, 1, "", false, func(c *relay.Config) { c.Sink = nullPublisher{} })
	if err != nil {
		return drainResult{}, err
	}
	elapsed, werr := g.waitFor(ctx, n, drainTimeout(n))
	if err := errors.Join(werr, g.stop()); err != nil {
		return drainResult{}, err
	}
	d := drainResult{events: g.dispatched.Load(), elapsed: elapsed, batches: g.batches.Load()}
	if pending, err := e.pending(ctx); err != nil || pending != 0 || d.events != n {
		return d, fmt.Errorf("dispatched %d of %d events, %d still pending (err %v)", d.events, n, pending, err)
	}
	return d, nil
}
