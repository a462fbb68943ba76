// Package rabbittest gives tests a RabbitMQ: the machine's server, or a
// private node of their own that they may kill and restart, and reads
// back what reached a queue.
package rabbittest

import (
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// URL is the machine's server: OUTBOX_TEST_AMQP_URL, or guest on
// 127.0.0.1:5672.
func URL() string {
	if u := os.Getenv("OUTBOX_TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// Dial connects to url, closed when t ends. When no server answers, it
// skips t, or fails it in CI (CI=true), where the server must run.
func Dial(t testing.TB, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("rabbittest: no RabbitMQ at %s in CI: %v", url, err)
		}
		t.Skipf("rabbittest: no RabbitMQ at %s (start rabbitmq-server, or set OUTBOX_TEST_AMQP_URL): %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Channel opens a channel on conn, failing t when it cannot.
func Channel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("rabbittest: cannot open a channel: %v", err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}

// Get takes every message from queue (acknowledging them), waiting until
// it has want or more and then no new one came for quiet, or until
// timeout, and returns what it took, in queue order. A missing queue
// gives nothing.
func Get(t testing.TB, conn *amqp.Connection, queue string, want int, quiet, timeout time.Duration) []amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("rabbittest: cannot open a channel: %v", err)
	}
	defer func() { _ = ch.Close() }()
	var out []amqp.Delivery
	deadline := time.Now().Add(timeout)
	last := time.Now()
	for time.Now().Before(deadline) {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			var ae *amqp.Error
			if ae, _ = err.(*amqp.Error); ae != nil && ae.Code == amqp.NotFound {
				return nil
			}
			t.Fatalf("rabbittest: get from %s: %v", queue, err)
		}
		if ok {
			out = append(out, d)
			last = time.Now()
			continue
		}
		if len(out) >= want && time.Since(last) >= quiet {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return out
}

// TopicQueue declares, on ch, a durable topic exchange and a durable queue
// both called name, the queue bound with "order.*", and deletes them (and
// the queue's dead-letter queue, name + ".dlq") when t ends.
func TopicQueue(t testing.TB, ch *amqp.Channel, name string) {
	t.Helper()
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatalf("rabbittest: declare exchange %s: %v", name, err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatalf("rabbittest: declare queue %s: %v", name, err)
	}
	if err := ch.QueueBind(name, "order.*", name, false, nil); err != nil {
		t.Fatalf("rabbittest: bind queue %s: %v", name, err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_, _ = ch.QueueDelete(name+".dlq", false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
	})
}
