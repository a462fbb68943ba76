package redispub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/redispub"
)

func msgs(topic string, agg uuid.UUID, from int64, n int) []relay.Message {
	out := make([]relay.Message, n)
	for i := range out {
		id := from + int64(i)
		out[i] = relay.Message{ID: id, AggregateID: agg, Type: topic + ".happened", Topic: topic,
			Payload: []byte(fmt.Sprintf(`{"n": %d}`, id))}
	}
	return out
}

func publish(t *testing.T, p *redispub.Publisher, m []relay.Message) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := p.Publish(ctx, m)
	require.Len(t, errs, len(m))
	return errs
}

// OOM is retriable and held by nobody: once memory is back, the same
// messages go through.
func TestOOMIsRetriable(t *testing.T) {
	t.Parallel()
	s := startPrivate(t)
	c := s.client()
	p, err := redispub.New(c, redispub.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
	m := msgs("oom", uuid.New(), 1, 3)
	errs := publish(t, p, m)
	for i, err := range errs {
		require.Error(t, err, i)
		require.False(t, relay.IsPermanent(err), "message %d: %v", i, err)
	}
	require.Equal(t, "OOM", p.ErrorCode(errs[0]))
	require.Equal(t, "not_sent", p.ErrorCode(errs[1]))
	require.ErrorContains(t, p.Ready(ctx), "publishing has failed since", "PING passes at maxmemory; readiness must not")
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	for i, err := range publish(t, p, m) {
		require.NoError(t, err, i)
	}
	require.NoError(t, p.Ready(ctx), "ready again once a publish went through")
	require.EqualValues(t, 3, c.XLen(ctx, "oom").Val())
}

// A server that restarted has lost its scripts: the publisher loads the
// script again and the same call goes through.
func TestScriptReloadedAfterFlush(t *testing.T) {
	t.Parallel()
	s := startPrivate(t)
	c := s.client()
	p, err := redispub.New(c, redispub.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	for _, err := range publish(t, p, msgs("flush", uuid.New(), 1, 2)) {
		require.NoError(t, err)
	}
	require.NoError(t, c.ScriptFlush(ctx).Err())
	for _, err := range publish(t, p, msgs("flush", uuid.New(), 3, 2)) {
		require.NoError(t, err)
	}
	require.EqualValues(t, 4, c.XLen(ctx, "flush").Val())
}

// MaxLen trims each stream to about that many entries.
func TestMaxLenTrims(t *testing.T) {
	t.Parallel()
	s := startPrivate(t)
	c := s.client()
	ctx := context.Background()
	// Exact trimming needs small radix tree nodes: with ~, Redis trims only
	// whole nodes.
	require.NoError(t, c.ConfigSet(ctx, "stream-node-max-entries", "10").Err())
	p, err := redispub.New(c, redispub.Config{MaxLen: 50})
	require.NoError(t, err)
	for k := range 10 {
		for _, err := range publish(t, p, msgs("trim", uuid.New(), int64(k*30+1), 30)) {
			require.NoError(t, err)
		}
	}
	n := c.XLen(ctx, "trim").Val()
	require.GreaterOrEqual(t, n, int64(50))
	require.Less(t, n, int64(100), "MaxLen 50 with nodes of 10 keeps fewer than 100 of 300")
}

// With Wait and no replica, nothing is acknowledged: the entries are on
// the primary only, and the relayer sends them again.
func TestWaitWithoutReplicasFails(t *testing.T) {
	t.Parallel()
	s := startPrivate(t)
	p, err := redispub.New(s.client(), redispub.Config{Wait: 1, WaitTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	errs := publish(t, p, msgs("wait", uuid.New(), 1, 2))
	for _, err := range errs {
		require.ErrorContains(t, err, "0 of 1 replicas")
		require.False(t, relay.IsPermanent(err))
		require.Equal(t, "not_replicated", p.ErrorCode(err))
	}
}

// WRONGTYPE holds the first message of each aggregate for its stream
// (invalid_topic) and leaves the other streams alone; an aggregate_id
// header of the row's own is held as reserved.
func TestRefusals(t *testing.T) {
	t.Parallel()
	s := startPrivate(t)
	c := s.client()
	ctx := context.Background()
	require.NoError(t, c.Set(ctx, "taken", "a string", 0).Err())
	p, err := redispub.New(c, redispub.Config{})
	require.NoError(t, err)
	a, b := uuid.New(), uuid.New()
	m := append(msgs("taken", a, 1, 2), msgs("free", b, 3, 2)...)
	m[3].Headers = map[string]string{"aggregate_id": "spoofed"}
	errs := publish(t, p, m)
	require.Equal(t, "invalid_topic", relay.ReasonOf(errs[0]), errs[0])
	require.Equal(t, "WRONGTYPE", p.ErrorCode(errs[0]))
	require.ErrorContains(t, errs[0], `key "taken" exists and is not a stream`)
	require.False(t, relay.IsPermanent(errs[1]), "the second is only behind the first")
	require.NoError(t, errs[2])
	require.Equal(t, "reserved_header", relay.ReasonOf(errs[3]), errs[3])
	require.EqualValues(t, 1, c.XLen(ctx, "free").Val())
}

// A server that is down fails every message, none permanently.
func TestServerDownIsRetriable(t *testing.T) {
	t.Parallel()
	s := startPrivate(t)
	p, err := redispub.New(s.client(), redispub.Config{})
	require.NoError(t, err)
	s.kill()
	errs := publish(t, p, msgs("down", uuid.New(), 1, 2))
	for _, err := range errs {
		require.Error(t, err)
		require.False(t, relay.IsPermanent(err), err)
	}
	require.Equal(t, "connection", p.ErrorCode(errs[0]), errs[0])
	require.Error(t, p.Ready(context.Background()))
}
