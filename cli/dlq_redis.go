package cli

import (
	"fmt"
	"log/slog"
	"net/url"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/outbox/consumer/dlq"
	"github.com/pgoutbox/outbox/consumer/redisconsumer"
	"github.com/pgoutbox/outbox/relay/redispub"
)

// openRedisDLQ opens the dead-letter streams of the Redis server a
// redis:// or rediss:// --sink names, the password from
// $OUTBOX_REDIS_PASSWORD as for `outbox consume`.
func openRedisDLQ(u *url.URL, _ *slog.Logger) (dlq.Store, error) {
	if _, has := u.User.Password(); has {
		return nil, fmt.Errorf("--sink %s holds a password; drop it from the URL and set %s instead (a flag's value shows in ps and shell history)", u.Redacted(), redisPasswordEnv)
	}
	opts, _, err := redispub.ParseURL(u.String(), redispub.Config{})
	if err != nil {
		return nil, fmt.Errorf("--sink: %w", err)
	}
	if pw := os.Getenv(redisPasswordEnv); pw != "" {
		opts.Password = pw
	}
	client := redis.NewClient(opts)
	store, err := redisconsumer.NewDeadLetters(client)
	if err != nil {
		client.Close()
		return nil, err
	}
	return store, nil
}
