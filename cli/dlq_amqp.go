package cli

import (
	"log/slog"
	"net/url"
	"os"

	"github.com/pgoutbox/outbox/consumer/amqpconsumer"
	"github.com/pgoutbox/outbox/consumer/dlq"
)

// openAMQPDeadLetters opens the dead-letter queues of the RabbitMQ server
// a --sink URL names (amqp[s]://user@host:5672/vhost, the password from
// OUTBOX_AMQP_PASSWORD when the URL has none).
func openAMQPDeadLetters(u *url.URL, _ *slog.Logger) (dlq.Store, error) {
	cfg, err := amqpConfig(u, os.Getenv(amqpPasswordEnv))
	if err != nil {
		return nil, err
	}
	return amqpconsumer.NewDeadLetters(cfg.URL)
}
