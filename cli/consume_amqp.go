package cli

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/consumer/amqpconsumer"
)

// consumeAMQP consumes one RabbitMQ queue (--topics: its name; it must
// exist, bound to the relay's exchange) with manual acks after commit;
// dead letters go to <queue>.dlq.
func consumeAMQP(_ context.Context, u *url.URL, env consumeEnv) (openedConsumer, error) {
	if len(env.topics) != 1 {
		return openedConsumer{}, errors.New("--topics: name the one RabbitMQ queue to consume (bound to the relay's exchange, e.g. with routing key pattern order.*)")
	}
	cfg, err := amqpConfig(u, os.Getenv(amqpPasswordEnv))
	if err != nil {
		return openedConsumer{}, err
	}
	env.disp.System = "rabbitmq"
	disp, err := consumer.NewDispatcher(env.disp)
	if err != nil {
		return openedConsumer{}, err
	}
	c, err := amqpconsumer.New(amqpconsumer.Config{URL: cfg.URL, Queue: env.topics[0], Dispatcher: disp,
		Workers: env.concurrency, Logger: env.log})
	if err != nil {
		return openedConsumer{}, err
	}
	return openedConsumer{run: amqpRunner{c, disp}, close: func() {}, ping: func(context.Context) error {
		conn, err := amqp.Dial(cfg.URL)
		if err != nil {
			return fmt.Errorf("cannot reach RabbitMQ at %s: %w; check --sink and that the server runs", u.Redacted(), err)
		}
		return conn.Close()
	}}, nil
}

// amqpRunner is the RabbitMQ consumer with its Dispatcher's counters.
type amqpRunner struct {
	*amqpconsumer.Consumer
	disp *consumer.Dispatcher
}

func (r amqpRunner) Stats() consumer.DispatcherStats { return r.disp.Stats() }

// amqpDemoQueue declares the demo's queue, bound to the relay's exchange
// for every type of its topic (prefix + "order.#").
func amqpDemoQueue(u *url.URL, prefix, queue string) error {
	cfg, err := amqpConfig(u, os.Getenv(amqpPasswordEnv))
	if err != nil {
		return err
	}
	conn, err := amqp.Dial(cfg.URL)
	if err != nil {
		return fmt.Errorf("cannot reach RabbitMQ at %s: %w", u.Redacted(), err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	exchange := cfg.WithDefaults().Exchange
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", exchange, err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %s: %w", queue, err)
	}
	if err := ch.QueueBind(queue, prefix+"order.#", exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s to %s: %w", queue, exchange, err)
	}
	return nil
}

// amqpDeleteQueues deletes the demo's queue and its dead-letter queue.
func amqpDeleteQueues(u *url.URL, queue string) error {
	cfg, err := amqpConfig(u, os.Getenv(amqpPasswordEnv))
	if err != nil {
		return err
	}
	conn, err := amqp.Dial(cfg.URL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	for _, q := range []string{queue, queue + amqpconsumer.DefaultDeadLetterSuffix} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("delete queue %s: %w", q, err)
		}
	}
	return nil
}
