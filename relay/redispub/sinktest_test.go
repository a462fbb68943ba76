package redispub_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay/redispub"
	"github.com/pgoutbox/outbox/relay/sinktest"
	"github.com/pgoutbox/outbox/routing"
)

// sinkMaxBytes is the publisher's MaxBytes in the suite.
const sinkMaxBytes = 100_000

// redisAddr is the machine's Redis server (REDIS_ADDR overrides it).
func redisAddr() string {
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// serverClient connects to the machine's Redis server, skipping the test
// when it does not answer (failing it under CI).
func serverClient(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redisAddr()})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis at %s: %v", redisAddr(), err)
		}
		t.Skipf("no Redis at %s (%v); start redis-server or set REDIS_ADDR", redisAddr(), err)
	}
	return c
}

// The Redis publisher passes the sink suite against the machine's Redis
// server, through a proxy that makes the server fail what a case needs:
//   - FailDestination: the proxy swaps each script call for the stream
//     for one the server answers with MASTERDOWN (a state a replica that
//     lost its primary answers every write with);
//   - FailMessage: the proxy cuts the connection when the call carrying
//     the message reaches it, as a network failure mid-pipeline does;
//   - RefuseMessage: the proxy adds one argument to that entry, so that
//     the server refuses its XADD (ERR wrong number of arguments) while it
//     adds the other entries of the call;
//   - RefuseDestination: the key is made a string, so the server answers
//     WRONGTYPE, with no proxy involved.
func TestSinkConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{Name: "redis", New: redisSink})
}

func redisSink(t *testing.T) *sinktest.Sink {
	t.Helper()
	server := serverClient(t)
	proxy := startProxy(t, redisAddr())
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	pub, err := redispub.New(client, redispub.Config{MaxBytes: sinkMaxBytes})
	require.NoError(t, err)
	var keys []string
	t.Cleanup(func() {
		if len(keys) > 0 {
			server.Del(context.Background(), keys...)
		}
	})
	return &sinktest.Sink{
		Sink: pub,
		Read: func(t *testing.T, dest string, _ int) []sinktest.Delivered {
			keys = append(keys, dest)
			return readStream(t, server, dest)
		},
		MaxBytes: sinkMaxBytes,
		FailDestination: func(_ *testing.T, dest string) func() {
			return proxy.add(func(args []string) ([]string, bool) {
				if c, ok := asPublishCall(args); ok && c.stream == dest {
					return []string{"EVAL", "return redis.error_reply(\"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\")", "0"}, false
				}
				return args, false
			})
		},
		RefuseDestination: func(t *testing.T, dest string) {
			keys = append(keys, dest)
			require.NoError(t, server.Set(context.Background(), dest, "not a stream", 0).Err())
		},
		FailMessage: func(_ *testing.T, dest string, id int64) func() {
			return proxy.add(func(args []string) ([]string, bool) {
				c, ok := asPublishCall(args)
				return args, ok && c.stream == dest && c.entryAt(id) >= 0
			})
		},
		RefuseMessage: func(_ *testing.T, dest string, id int64) {
			proxy.add(func(args []string) ([]string, bool) {
				c, ok := asPublishCall(args)
				if !ok || c.stream != dest {
					return args, false
				}
				if at := c.entryAt(id); at >= 0 {
					return c.withExtraArg(at), false
				}
				return args, false
			})
		},
	}
}

// readStream reads every entry of stream back (XRANGE), as a consumer
// sees it.
func readStream(t *testing.T, c *redis.Client, stream string) []sinktest.Delivered {
	t.Helper()
	entries, err := c.XRange(context.Background(), stream, "-", "+").Result()
	if redis.HasErrorPrefix(err, "WRONGTYPE") {
		return nil // a key made a string, which no entry reached
	}
	require.NoError(t, err)
	out := make([]sinktest.Delivered, 0, len(entries))
	for _, e := range entries {
		d := sinktest.Delivered{Headers: map[string]string{}}
		for k, v := range e.Values {
			s, _ := v.(string)
			switch {
			case k == routing.RedisPayloadField:
				d.Payload = []byte(s)
			case strings.HasPrefix(k, routing.RedisHeaderPrefix):
				d.Headers[strings.TrimPrefix(k, routing.RedisHeaderPrefix)] = s
			default:
				d.Headers[k] = s
			}
		}
		d.ID, _ = strconv.ParseInt(d.Headers[outbox.HeaderEventID], 10, 64)
		d.Key, d.Type = d.Headers[outbox.HeaderAggregateID], d.Headers[outbox.HeaderEventType]
		out = append(out, d)
	}
	return out
}
