package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/examples/orders/shop"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// Sink is a run's broker when it is not Kafka: NATS, RabbitMQ, Redis or
// a webhook endpoint, built by the CLI from `outbox demo --sink`.
type Sink struct {
	// Name says where the events go, for the report: "redis at ...".
	Name string
	// Open opens one relayer's sink, stamping source on its events, and
	// returns how to close it once the relayer stopped.
	Open func(ctx context.Context, source string) (relay.Sink, func(), error)
	// Consume opens the loyalty consumer with disp (its name, pool,
	// tables and handlers set) on the events the relayers route with
	// prefix: those of shop.Topic go to topic (the relay's topic of
	// "order.*", prefix included).
	Consume func(ctx context.Context, disp consumer.DispatcherConfig, prefix, topic string) (Consumer, func(), error)
	// Remove, when set, deletes what the run left on the server for its
	// prefix and topic (streams, queues); KeepSchema keeps them.
	Remove func(ctx context.Context, prefix, topic string) error
	// Dedupes says the server drops a message published again under the
	// same id (NATS JetStream's Nats-Msg-Id, within its window): the
	// forced redeliveries then never reach the consumer, and the run
	// checks that they were published and applied no second time.
	Dedupes bool
}

// Consumer is the loyalty consumer on a Sink's transport.
type Consumer interface {
	Run(ctx context.Context) error
	Stats() consumer.DispatcherStats
}

// counts are the loyalty consumer's figures the demo checks.
type counts struct{ processed, duplicates, deadLettered int64 }

// loyalty is the loyalty consumer, whatever its transport.
type loyalty interface {
	Run(ctx context.Context) error
	counts() counts
}

type kafkaLoyalty struct{ *consumer.Consumer }

func (k kafkaLoyalty) counts() counts {
	s := k.Stats()
	return counts{s.Processed, s.Duplicates, s.DeadLettered}
}

type sinkLoyalty struct{ Consumer }

func (s sinkLoyalty) counts() counts {
	st := s.Stats()
	return counts{st.Processed, st.Duplicates, st.DeadLettered}
}

// openBroker opens the run's broker: the Sink when the CLI gave one,
// else Kafka.
func (d *demo) openBroker(ctx context.Context) error {
	if d.cfg.Sink == nil {
		return d.openKafka(ctx)
	}
	s := d.cfg.Sink
	d.rep.Broker = s.Name
	// Names carry the schema, so runs against one server do not read
	// each other's events.
	d.prefix = d.rep.Schema + "."
	topic := d.prefix + shop.Topic
	if s.Remove != nil && !d.cfg.KeepSchema {
		d.deferred(func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := s.Remove(dctx, d.prefix, topic); err != nil {
				fmt.Fprintf(d.out, "warning: could not remove what the demo left on %s: %s\n", s.Name, err)
			}
		})
	}
	fmt.Fprintf(d.out, "database %s, schema %s\nbroker   %s\n", d.rep.Database, d.rep.Schema, d.rep.Broker)
	return nil
}

// newSink opens relayer i's sink.
func (d *demo) newSink(ctx context.Context) (relay.Sink, error) {
	if d.cfg.Sink == nil {
		client, err := kafkapub.NewPublisherClient(d.kcfg)
		if err != nil {
			return nil, err
		}
		d.deferred(client.Close)
		return kafkapub.NewPublisher(client, kafkapub.PublisherConfig{Source: d.rep.Schema}), nil
	}
	sink, closeSink, err := d.cfg.Sink.Open(ctx, d.rep.Schema)
	if err != nil {
		return nil, err
	}
	d.deferred(closeSink)
	return sink, nil
}

// newProducer makes the producer with the sink's routing, so Emit checks
// what the relayers will publish.
func (d *demo) newProducer(sink relay.Sink) error {
	cfg := outbox.Config{Tables: d.tables, TopicPrefix: d.prefix}
	if d.cfg.Sink != nil {
		r, err := sink.Routing(d.prefix)
		if err != nil {
			return err
		}
		cfg = outbox.Config{Tables: d.tables, Routing: r}
	}
	p, err := outbox.NewProducer(cfg)
	if err != nil {
		return err
	}
	d.producer = p
	return nil
}

// newLoyalty makes the loyalty consumer.
func (d *demo) newLoyalty(ctx context.Context) (loyalty, error) {
	log := d.cfg.Logger.With("consumer", shop.LoyaltyConsumer)
	if d.cfg.Sink == nil {
		c, err := consumer.New(consumer.Config{
			Name: d.consumerName(), Pool: d.pool, Tables: d.tables,
			Client: d.kcfg, Topics: []string{d.prefix + shop.Topic},
			Handlers: shop.Handlers(), Logger: log,
		})
		return kafkaLoyalty{c}, err
	}
	c, closeCons, err := d.cfg.Sink.Consume(ctx, consumer.DispatcherConfig{Name: d.consumerName(), Pool: d.pool, Tables: d.tables,
		Handlers: shop.Handlers(), Logger: log}, d.prefix, d.prefix+shop.Topic)
	if err != nil {
		return nil, err
	}
	d.deferred(closeCons)
	return sinkLoyalty{c}, nil
}
