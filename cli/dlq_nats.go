package cli

import (
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/pgoutbox/outbox/consumer/dlq"
	"github.com/pgoutbox/outbox/consumer/natsconsumer"
)

// openNATSDeadLetters opens the dead letters on the NATS server a
// nats:// URL names, with the settings `outbox consume --sink` takes (so
// its URL can be given as it is); --topic names the dead-letter stream.
func openNATSDeadLetters(u *url.URL, log *slog.Logger) (dlq.Store, error) {
	c, err := parseNATSURL(u, os.Getenv, natsConsumeQuery...)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(strings.Join(c.servers, ","), c.opts...)
	if err != nil {
		return nil, fmt.Errorf("cannot reach NATS at %s: %s; check --sink", u.Redacted(), oneLine(err.Error()))
	}
	log.Debug("reading dead letters", "sink", u.Redacted())
	store, err := natsconsumer.NewDeadLetters(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return store, nil
}
