package amqppub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cloudevents"
	"github.com/pgoutbox/outbox/internal/pgtext"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/routing"
)

// Defaults of Config, applied by WithDefaults.
const (
	DefaultExchange       = "outbox"
	DefaultMaxBytes       = routing.DefaultAMQPMaxBytes
	DefaultConnectTimeout = 10 * time.Second
	DefaultHeartbeat      = 10 * time.Second
	DefaultConfirmTimeout = 30 * time.Second
)

// Config configures a Publisher.
type Config struct {
	// URL is the server: amqp://user:pass@host:5672/vhost, or amqps://
	// for TLS (verified against the system's roots, or the cacertfile
	// query parameter's). Required.
	URL string
	// Exchange is the durable topic exchange events are published to,
	// declared when missing. Defaults to DefaultExchange ("outbox").
	Exchange string
	// Source, when set, goes into every message's event_source header.
	// Keep it to outbox.MaxSourceLen bytes. Defaults to "" (no header).
	Source string
	// MaxBytes is the largest message body published: set it to the
	// server's max_message_size, which AMQP does not announce. A larger
	// event is held as too large without being sent; when the server
	// refuses one for its size anyway, the Publisher learns the server's
	// figure from the refusal. Defaults to DefaultMaxBytes (128 MiB,
	// RabbitMQ's default).
	MaxBytes int
	// ConnectTimeout bounds dialing and the AMQP handshake. Defaults to
	// DefaultConnectTimeout (10s).
	ConnectTimeout time.Duration
	// Heartbeat is the AMQP heartbeat interval asked of the server, which
	// finds a dead connection within about twice that. Defaults to
	// DefaultHeartbeat (10s).
	Heartbeat time.Duration
	// ConfirmTimeout bounds one Publish call: the messages the server
	// has not confirmed by then fail for a retry. Defaults to
	// DefaultConfirmTimeout (30s).
	ConfirmTimeout time.Duration
	// CloudEvents, when set, stamps every message with the CloudEvents
	// attributes of its event in the AMQP binding's binary mode:
	// cloudEvents_ headers (cloudEvents_specversion, cloudEvents_id,
	// cloudEvents_source, cloudEvents_type, cloudEvents_subject,
	// cloudEvents_time, cloudEvents_dataschema), which RabbitMQ hands AMQP
	// 1.0 consumers as application properties, with the content_type
	// property as datacontenttype (package cloudevents). Defaults to nil
	// (no CloudEvents headers).
	CloudEvents *cloudevents.Config
	// Logger receives connection events. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) WithDefaults() Config {
	if cfg.Exchange == "" {
		cfg.Exchange = DefaultExchange
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.ConfirmTimeout == 0 {
		cfg.ConfirmTimeout = DefaultConfirmTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Validate reports the first field of cfg that a Publisher cannot use,
// saying what to set instead.
func (cfg Config) Validate() error {
	if cfg.URL == "" {
		return errors.New("amqppub: URL is required: set it to amqp://user:pass@host:5672/vhost")
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
		return fmt.Errorf("amqppub: URL %q is not an AMQP URL; write amqp://user:pass@host:5672/vhost (or amqps://)", redact(cfg.URL))
	}
	if _, err := amqp.ParseURI(cfg.URL); err != nil {
		return fmt.Errorf("amqppub: URL %q: %v", redact(cfg.URL), err)
	}
	if len(cfg.Exchange) > routing.MaxRoutingKeyLen {
		return fmt.Errorf("amqppub: Exchange is %d bytes; AMQP names hold at most 255", len(cfg.Exchange))
	}
	if cfg.CloudEvents != nil {
		if err := cfg.CloudEvents.Validate(); err != nil {
			return fmt.Errorf("amqppub: CloudEvents: %w", err)
		}
	}
	if len(cfg.Source) > outbox.MaxSourceLen || pgtext.Invalid(cfg.Source) != "" {
		return fmt.Errorf("amqppub: Source: use at most %d bytes of UTF-8 text without NUL (producers size events for that)", outbox.MaxSourceLen)
	}
	if cfg.MaxBytes < 0 || cfg.ConnectTimeout < 0 || cfg.Heartbeat < 0 || cfg.ConfirmTimeout < 0 {
		return errors.New("amqppub: MaxBytes, ConnectTimeout, Heartbeat and ConfirmTimeout must not be negative; use 0 for their defaults")
	}
	return nil
}

// redact is raw with any password replaced.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if i := strings.LastIndex(raw, "@"); i >= 0 {
			return "…" + raw[i:]
		}
		return raw
	}
	return u.Redacted()
}

// Publisher is a relay.Sink on one AMQP connection and one channel in
// confirm mode, opened on the first Publish and again after either
// closes.
//
// Per-aggregate order: RabbitMQ may refuse one message (a nack, a
// return) and accept the next on the same channel, so a Publisher never
// has two messages of one aggregate in flight: an aggregate's next message
// is sent once the previous one is confirmed, while the messages of other
// aggregates fly alongside. An aggregate's messages after a failed one are
// not sent.
type Publisher struct {
	cfg Config
	log *slog.Logger

	// mu serialises Publish calls and guards conn, ch and maxBytes.
	mu       sync.Mutex
	conn     *amqp.Connection
	ch       *openChannel
	maxBytes int
	// raw is conn's network connection: closing it unblocks a write the
	// server does not read (a connection blocked by a resource alarm),
	// which amqp091 bounds by no deadline.
	raw net.Conn
	// lastErr is the error of the last attempt to open the channel, nil
	// once one succeeded: Ready's answer while a Publish runs.
	lastErr atomic.Pointer[error]
}

// A Publisher is a relay.Sink, and tells /readyz whether it can publish.
var (
	_ relay.Sink    = (*Publisher)(nil)
	_ relay.Readier = (*Publisher)(nil)
)

// New returns a Publisher for cfg, after applying its defaults and
// validating it. It does not dial: the first Publish (or Ping) does.
func New(cfg Config) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Publisher{cfg: cfg, log: cfg.Logger, maxBytes: cfg.MaxBytes}, nil
}

// Exchange is the exchange the Publisher publishes to.
func (p *Publisher) Exchange() string { return p.cfg.Exchange }

// Routing is RabbitMQ's routing for topicPrefix: routing.AMQP with the
// Publisher's MaxBytes, so a type Emit accepts is one the relayer can
// publish.
func (p *Publisher) Routing(topicPrefix string) (outbox.Routing, error) {
	r := routing.AMQP{TopicPrefix: topicPrefix, MaxBytes: p.cfg.MaxBytes}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}

// MessagingSystem names RabbitMQ in the relayer's publish spans.
func (p *Publisher) MessagingSystem() string { return "rabbitmq" }

// Ping connects (when not connected) and makes sure the exchange exists,
// with an error that says what to fix.
func (p *Publisher) Ping(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.channel(ctx)
	return err
}

// Ready reports whether the Publisher can publish now: its connection is
// open, or a new one can be opened. While a Publish holds the connection
// it answers at once from how the last attempt to open it went.
func (p *Publisher) Ready(ctx context.Context) error {
	if !p.mu.TryLock() {
		if err := p.lastErr.Load(); err != nil {
			return *err
		}
		return nil
	}
	defer p.mu.Unlock()
	_, err := p.channel(ctx)
	return err
}

// Close closes the connection. Publish after Close connects again.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropLocked()
	return nil
}

// dropLocked closes the channel and the connection, so the next Publish
// starts afresh.
func (p *Publisher) dropLocked() {
	if p.ch != nil {
		_ = p.ch.ch.Close()
		p.ch = nil
	}
	if p.conn != nil {
		_ = p.conn.Close()
		p.conn = nil
	}
}

// dial opens a connection within ctx and ConnectTimeout.
func (p *Publisher) dial(ctx context.Context) (*amqp.Connection, error) {
	timeout := p.cfg.ConnectTimeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = max(time.Until(d), time.Millisecond)
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outbox relay")
	conn, err := amqp.DialConfig(p.cfg.URL, amqp.Config{
		Heartbeat:  p.cfg.Heartbeat,
		Locale:     "en_US",
		Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			p.raw = c
			// The handshake must finish in time too; amqp091 clears the
			// deadline once the connection is open.
			return c, c.SetDeadline(time.Now().Add(timeout))
		},
	})
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", errDial, redact(p.cfg.URL), err)
	}
	return conn, nil
}
