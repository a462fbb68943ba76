package cli

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/outbox/relay/redispub"
)

// redisPasswordEnv holds the Redis password of `outbox relay --sink
// redis://...`: a flag's value shows in ps and shell history.
const redisPasswordEnv = "OUTBOX_REDIS_PASSWORD"

// openRedisURL opens the Redis Streams sink for redis://host:port/db or
// rediss://... (TLS), with the publisher's settings in the query (maxlen,
// wait, wait_timeout, max_bytes) beside go-redis's own.
func openRedisURL(_ context.Context, u *url.URL, env sinkEnv) (openedSink, error) {
	if env.ce != nil {
		return openedSink{}, errors.New("--cloudevents: Redis Streams has no CloudEvents protocol binding, so there is no standard way to carry the attributes in a stream entry; drop --cloudevents (consumers read event_id, event_type and event_source from the entry's fields), or relay to a sink that has one (Kafka, NATS, RabbitMQ, webhooks)")
	}
	if _, has := u.User.Password(); has {
		return openedSink{}, fmt.Errorf("--sink %s holds a password; drop it from the URL and set %s instead (a flag's value shows in ps and shell history)", u.Redacted(), redisPasswordEnv)
	}
	opts, cfg, err := redispub.ParseURL(u.String(), redispub.Config{Source: env.source})
	if err != nil {
		return openedSink{}, fmt.Errorf("--sink: %w", err)
	}
	if pw := os.Getenv(redisPasswordEnv); pw != "" {
		opts.Password = pw
	}
	q := u.Query()
	if !q.Has("read_timeout") {
		opts.ReadTimeout = env.deliver
	}
	if !q.Has("write_timeout") {
		opts.WriteTimeout = env.deliver
	}
	v, release, err := env.conns.get(env.key, func() (any, func(), error) {
		client := redis.NewClient(opts)
		return client, func() { client.Close() }, nil
	})
	if err != nil {
		return openedSink{}, err
	}
	client := v.(*redis.Client)
	pub, err := redispub.New(client, cfg)
	if err != nil {
		release()
		return openedSink{}, fmt.Errorf("--sink: %w", err)
	}
	addr := opts.Addr
	return openedSink{
		sink: pub,
		ping: func(ctx context.Context) error {
			if err := client.Ping(ctx).Err(); err != nil {
				var re redis.Error
				if errors.As(err, &re) {
					return fmt.Errorf("redis at %s refused PING: %w (set %s when it needs a password)", addr, err, redisPasswordEnv)
				}
				return fmt.Errorf("cannot reach redis at %s: %w; is redis-server running there?", addr, err)
			}
			return nil
		},
		close: release,
	}, nil
}
