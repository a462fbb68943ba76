package bench

import (
	"context"
	"fmt"
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

type relayVariant struct {
	key, name string
	relayers  int
	mod       func(*relay.Config)
}

func runRelay(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	n := int64(cfg.Events)
	e, err := s.newEnv(ctx, "relay", 4)
	if err != nil {
		return nil, err
	}
	defer e.close()

	res := &Result{}
	res.param("preload", "%s pending events over %s aggregates (INSERT ... SELECT generate_series, then VACUUM ANALYZE), fresh for every drain", thousands(n), thousands(int64(cfg.Aggregates)))
	res.param("relay", "relay.New with defaults (batch 1,000, per-aggregate order on) + kafka.Publisher; each relayer has its own pool and Kafka client")
	res.param("bare SQL", "one client, no broker, no ordering rule: UPDATE ... WHERE id IN (SELECT id ... ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED) until no row is left")
	res.param("timing", "from start to the commit of the batch that dispatched the last event")

	t := Table{Title: fmt.Sprintf("drain %s events", thousands(n)), Columns: []string{"drainer", "events/s", "seconds", "batches", "vs bare SQL"}}
	bare, err := drainBare(ctx, s, e, n, bareClaimSQL)
	if err != nil {
		return nil, fmt.Errorf("bare SQL: %w", err)
	}
	row := func(name string, d drainResult) {
		t.Rows = append(t.Rows, []string{name, rate(d.rate()), fmt.Sprintf("%.2f", d.elapsed.Seconds()), thousands(d.batches), ratio(d.rate() / bare.rate())})
	}
	row("bare SQL claim-and-mark (1 client)", bare)
	res.metric("relay.bare.events_per_s", bare.rate())
	ret, err := drainBare(ctx, s, e, n, bareReturningSQL)
	if err != nil {
		return nil, fmt.Errorf("bare SQL with RETURNING: %w", err)
	}
	row("bare SQL + RETURNING the rows (1 client)", ret)
	res.metric("relay.bare_returning.events_per_s", ret.rate())

	variants := []relayVariant{
		{key: "relayers_1", name: "outbox relay, 1 relayer", relayers: 1},
		{key: "relayers_2", name: "outbox relay, 2 relayers", relayers: 2},
		{key: "relayers_4", name: "outbox relay, 4 relayers", relayers: 4},
	}
	if !cfg.Short {
		variants = append(variants,
			relayVariant{key: "relayers_1_batch_5000", name: "outbox relay, 1 relayer, batch 5,000", relayers: 1, mod: func(c *relay.Config) { c.BatchSize = 5000 }},
			relayVariant{key: "relayers_2_batch_5000", name: "outbox relay, 2 relayers, batch 5,000", relayers: 2, mod: func(c *relay.Config) { c.BatchSize = 5000 }},
		)
	}
	var best drainResult
	bestRate, bestName := -1.0, ""
	for _, v := range variants {
		d, err := drainRelay(ctx, s, e, n, v.relayers, v.mod)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v.name, err)
		}
		row(v.name, d)
		res.metric("relay."+v.key+".events_per_s", d.rate())
		res.metric("relay."+v.key+".dispatched", float64(d.events))
		res.metric("relay."+v.key+".published", float64(d.published))
		if v.mod == nil && d.rate() > bestRate {
			best, bestRate, bestName = d, d.rate(), v.name
		}
	}
	res.Tables = append(res.Tables, t)
	r := best.rate() / bare.rate()
	res.metric("relay.ratio_bare", r)
	res.target("relay vs bare SQL", ">= 0.70x bare claim-and-mark, ordering on", fmt.Sprintf("%.2fx (%s: %s vs %s events/s)", r, bestName, rate(best.rate()), rate(bare.rate())), r >= 0.7)

	if cfg.Watermill {
		wm, err := s.runWatermill(ctx, n)
		if err != nil {
			return res, fmt.Errorf("watermill: %w", err)
		}
		wmTable(res, wm)
		wr := best.rate() / wm.EventsPerS
		res.metric("relay.ratio_watermill", wr)
		res.target("relay vs Watermill", ">= 10x the Watermill forwarder (batch 1,000, 10 ms poll)", fmt.Sprintf("%.1fx (%s vs %s events/s)", wr, rate(best.rate()), rate(wm.EventsPerS)), wr >= 10)
	} else {
		res.note("add --watermill to drain the same preload with the Watermill forwarder (bench/watermill) and report outbox / Watermill")
	}
	return res, nil
}

// drainBare resets the table and drains it with one client running sql
// until a statement finds nothing.
func drainBare(ctx context.Context, s *session, e *env, n int64, sql string) (drainResult, error) {
	if err := e.reset(ctx, int(n), s.cfg.Aggregates); err != nil {
		return drainResult{}, err
	}
	s.progress("relay: bare SQL drain of %d events", n)
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return drainResult{}, err
	}
	defer conn.Release()
	stmt := fmt.Sprintf(sql, e.tables.OutboxIdent())
	var d drainResult
	start := time.Now()
	for {
		rows, err := conn.Query(ctx, stmt)
		if err != nil {
			return d, err
		}
		var got int64
		for rows.Next() {
			if _, err := rows.Values(); err != nil {
				rows.Close()
				return d, err
			}
			got++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return d, err
		}
		if got == 0 {
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
func drainRelay(ctx context.Context, s *session, e *env, n int64, relayers int, mod func(*relay.Config)) (drainResult, error) {
	if err := e.reset(ctx, int(n), s.cfg.Aggregates); err != nil {
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
