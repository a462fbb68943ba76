package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/redispub"
	"github.com/pgoutbox/outbox/routing"
)

// redisServer is the scenario's own redis-server: append-only file on,
// fsynced every second (Redis's default with AOF), for the relay and the
// bare client alike.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
	dir  string
}

func startRedisServer(ctx context.Context) (*redisServer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "outbox-bench-redis-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--dir", dir)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redis-server (apt-get install redis-server): %w", err)
	}
	r := &redisServer{addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd, dir: dir}
	c := r.client()
	defer c.Close()
	for deadline := time.Now().Add(20 * time.Second); c.Ping(ctx).Err() != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			r.close()
			return nil, fmt.Errorf("redis-server on %s did not answer within 20s", r.addr)
		}
	}
	return r, nil
}

func (r *redisServer) client() *redis.Client { return redis.NewClient(&redis.Options{Addr: r.addr}) }

func (r *redisServer) close() {
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	os.RemoveAll(r.dir)
}

func runRedis(ctx context.Context, s *session) (*Result, error) {
	cfg := s.cfg
	n := int64(cfg.Events)
	srv, err := startRedisServer(ctx)
	if err != nil {
		return nil, err
	}
	defer srv.close()
	e, err := s.newEnv(ctx, "redis", int32(latencyWriters(cfg.Writers, 1000)))
	if err != nil {
		return nil, err
	}
	defer e.close()
	res := &Result{}
	res.param("server", "a redis-server of its own (7.x), appendonly yes, appendfsync everysec, on loopback")
	res.param("relay", "relay.New with defaults (batch 5,000) + redispub.Publisher (one script call per aggregate run, pipelined)")
	res.param("go-redis", "the same rows, read out beforehand, as the same entries (same fields), XADD pipelined 5,000 at a time by go-redis v9 alone: no ordering guard")
	bare, err := redisBare(ctx, s, e, srv, n)
	if err != nil {
		return nil, fmt.Errorf("go-redis alone: %w", err)
	}
	drain, err := redisDrain(ctx, s, e, srv, n)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	null, err := drainNull(ctx, s, e, n)
	if err != nil {
		return nil, fmt.Errorf("relay, no broker: %w", err)
	}
	t := Table{Title: fmt.Sprintf("publish %s events to a Redis stream", thousands(n)), Columns: []string{"publisher", "events/s", "seconds"}}
	t.Rows = append(t.Rows,
		[]string{"go-redis alone, pipelined XADD", rate(bare.rate()), fmt.Sprintf("%.2f", bare.elapsed.Seconds())},
		[]string{"outbox relay -> Redis (Postgres claim, publish, mark)", rate(drain.rate()), fmt.Sprintf("%.2f", drain.elapsed.Seconds())},
		[]string{"outbox relay, publisher that acks at once (the Postgres side alone)", rate(null.rate()), fmt.Sprintf("%.2f", null.elapsed.Seconds())})
	res.Tables = append(res.Tables, t)
	ratio := drain.rate() / bare.rate()
	res.metric("redis.go_redis.events_per_s", bare.rate())
	res.metric("redis.relay.events_per_s", drain.rate())
	res.metric("redis.ratio_go_redis", ratio)
	res.metric("redis.relay_null.events_per_s", null.rate())
	res.target("redis relay vs go-redis", ">= 0.6x go-redis publishing the same entries", fmt.Sprintf("%.2fx (%s vs %s events/s)", ratio, rate(drain.rate()), rate(bare.rate())), ratio >= 0.6)
	return res, redisLatency(ctx, s, e, srv, res)
}

// redisBare resets the outbox, reads its rows out and times go-redis
// adding them as the Publisher's entries, 5,000 to a pipeline.
func redisBare(ctx context.Context, s *session, e *env, srv *redisServer, n int64) (drainResult, error) {
	if err := e.reset(ctx, int(n), s.cfg.Aggregates); err != nil {
		return drainResult{}, err
	}
	rows, err := e.pool.Query(ctx, "SELECT id, aggregate_id, type, payload::text FROM "+e.tables.OutboxIdent()+" ORDER BY id")
	if err != nil {
		return drainResult{}, err
	}
	var entries [][]any
	for rows.Next() {
		var id int64
		var agg uuid.UUID
		var typ, payload string
		if err := rows.Scan(&id, &agg, &typ, &payload); err != nil {
			rows.Close()
			return drainResult{}, err
		}
		entries = append(entries, []any{outbox.HeaderEventID, strconv.FormatInt(id, 10), outbox.HeaderEventType, typ,
			outbox.HeaderAggregateID, agg.String(), outbox.HeaderContentType, outbox.ContentTypeJSON, routing.RedisPayloadField, payload})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return drainResult{}, err
	}
	c := srv.client()
	defer c.Close()
	s.progress("redis: go-redis alone adding %d entries", len(entries))
	start := time.Now()
	for i := 0; i < len(entries); i += relay.DefaultBatchSize {
		pipe := c.Pipeline()
		for _, f := range entries[i:min(i+relay.DefaultBatchSize, len(entries))] {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: "bare", Values: f})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return drainResult{}, err
		}
	}
	return drainResult{events: int64(len(entries)), elapsed: time.Since(start)}, nil
}

// redisDrain resets the outbox and drains it with one relayer to the
// server.
func redisDrain(ctx context.Context, s *session, e *env, srv *redisServer, n int64) (drainResult, error) {
	if err := e.reset(ctx, int(n), s.cfg.Aggregates); err != nil {
		return drainResult{}, err
	}
	c := srv.client()
	defer c.Close()
	pub, err := redispub.New(c, redispub.Config{})
	if err != nil {
		return drainResult{}, err
	}
	s.progress("redis: 1 relayer draining %d events", n)
	g, err := e.startRelayers(ctx, nil, 1, "", false, func(rc *relay.Config) { rc.Sink = pub })
	if err != nil {
		return drainResult{}, err
	}
	elapsed, werr := g.waitFor(ctx, n, drainTimeout(n))
	if err := errors.Join(werr, g.stop()); err != nil {
		return drainResult{}, err
	}
	if got := c.XLen(ctx, "order").Val(); got < n {
		return drainResult{}, fmt.Errorf("stream order holds %d of %d events", got, n)
	}
	return drainResult{events: g.dispatched.Load(), elapsed: elapsed, batches: g.batches.Load()}, nil
}

// redisLatency emits one event per transaction at 1,000 a second and
// measures commit-to-acknowledgement with one relayer publishing to the
// server (defaults: LISTEN/NOTIFY, busy polling).
func redisLatency(ctx context.Context, s *session, e *env, srv *redisServer, res *Result) error {
	window := pick(s.cfg.Short, 500*time.Millisecond, 10*time.Second)
	if err := e.exec(ctx, "TRUNCATE "+e.tables.OutboxIdent()); err != nil {
		return err
	}
	p, err := outbox.NewProducer(outbox.Config{Tables: e.tables, Routing: routing.Redis{TopicPrefix: "lat:"}})
	if err != nil {
		return err
	}
	c := srv.client()
	defer c.Close()
	pub, err := redispub.New(c, redispub.Config{})
	if err != nil {
		return err
	}
	clock := &ackClock{Sink: pub, acked: map[int64]time.Time{}, commited: map[int64]time.Time{}}
	g, err := e.startRelayers(ctx, nil, 1, "lat:", true, func(rc *relay.Config) { rc.Sink = clock })
	if err != nil {
		return err
	}
	defer g.stop() //nolint:errcheck // stopped below; a second stop is a no-op
	time.Sleep(300 * time.Millisecond)
	r := latencyRun{rate: 1000}
	s.progress("redis: latency at %d events/s", r.rate)
	em, err := emitAtRate(ctx, s, e, p, clock, r, window, latencyWriters(s.cfg.Writers, r.rate))
	if err != nil {
		return err
	}
	if _, err := g.waitFor(ctx, em.events, 30*time.Second); err != nil {
		return err
	}
	if err := g.stop(); err != nil {
		return err
	}
	lat, err := clock.latencies()
	if err != nil {
		return err
	}
	p50, p99, mx := percentile(lat, 50), percentile(lat, 99), percentile(lat, 100)
	res.Tables = append(res.Tables, Table{Title: "commit-to-Redis-ack latency, 1 relayer, defaults",
		Columns: []string{"rate", "achieved ev/s", "events", "p50 ms", "p99 ms", "max ms"},
		Rows:    [][]string{{"1,000/s", rate(perSecond(em.events, em.elapsed)), thousands(em.events), ms(p50), ms(p99), ms(mx)}}})
	res.metric("redis.latency.1000.p50_ms", float64(p50)/float64(time.Millisecond))
	res.metric("redis.latency.1000.p99_ms", float64(p99)/float64(time.Millisecond))
	res.target("redis latency @1,000/s", "p50 <= 5 ms, p99 <= 20 ms", fmt.Sprintf("p50 %s ms, p99 %s ms", ms(p50), ms(p99)), p50 <= 5*time.Millisecond && p99 <= 20*time.Millisecond)
	return nil
}
