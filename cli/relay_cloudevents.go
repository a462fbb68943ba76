package cli

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
)

// cloudEventsFlags are `outbox relay --cloudevents` and its settings:
// each sink stamps the CloudEvents attributes in its binding's binary
// mode (package cloudevents).
type cloudEventsFlags struct {
	on         bool
	source     string
	dataSchema string
}

func (c *cloudEventsFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&c.on, "cloudevents", false, "stamp every message with CloudEvents 1.0 attributes in the sink's binary mode (ce_ headers on Kafka, ce- on NATS and webhooks, cloudEvents_ on RabbitMQ; not on Redis Streams, which has no binding)")
	f.StringVar(&c.source, "cloudevents-source", "", "the CloudEvents source attribute, a URI-reference naming this outbox (default: urn:outbox:<--source>, or urn:outbox:<database>/<schema>.<table>)")
	f.StringVar(&c.dataSchema, "cloudevents-dataschema", "", "absolute URI ending in '/' where the contracts directory is served: dataschema is <URI><type>/v<N>.schema.json (default: urn:outbox:contract:<type>:v<N>)")
}

// config is the CloudEvents config of the relay, or nil without
// --cloudevents. source is --source; databaseURL and t name the outbox
// when neither --cloudevents-source nor --source does.
func (c *cloudEventsFlags) config(source, databaseURL string, t outbox.Tables) (*cloudevents.Config, error) {
	if !c.on {
		if c.source != "" || c.dataSchema != "" {
			return nil, errors.New("--cloudevents-source and --cloudevents-dataschema set what --cloudevents stamps; add --cloudevents, or drop them")
		}
		return nil, nil
	}
	cfg := cloudevents.Config{Source: c.source, DataSchema: c.dataSchema}
	if cfg.Source == "" {
		cfg.Source = cloudevents.DefaultSource(defaultSourceName(source, databaseURL, t))
	}
	if err := cfg.Validate(); err != nil {
		flag := "--cloudevents-source"
		if c.source == "" && c.dataSchema == "" {
			flag = "--cloudevents"
		} else if c.dataSchema != "" && (cloudevents.Config{Source: cfg.Source}).Validate() == nil {
			flag = "--cloudevents-dataschema"
		}
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return &cfg, nil
}

// defaultSourceName names the outbox for the default CloudEvents source:
// the relay's event_source, else its database and table, so that two
// outboxes (whose event ids overlap) never share a source.
func defaultSourceName(source, databaseURL string, t outbox.Tables) string {
	if source != "" {
		return source
	}
	table := t.WithDefaults().Schema + "." + t.WithDefaults().Outbox
	if pc, err := pgxpool.ParseConfig(databaseURL); err == nil && pc.ConnConfig.Database != "" {
		return pc.ConnConfig.Database + "/" + table
	}
	return table
}
