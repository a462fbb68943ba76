package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/consumer/consumermetrics"
	"github.com/pgoutbox/outbox/consumer/redisconsumer"
	"github.com/pgoutbox/outbox/consumer/webhookconsumer"
	"github.com/pgoutbox/outbox/relay/redispub"
)

// consumeEnv is what every transport's consumer is opened with: the
// Dispatcher's configuration (name, pool, tables, the printing handler,
// logger) and the flags that mean the same on every transport.
type consumeEnv struct {
	log  *slog.Logger
	disp consumer.DispatcherConfig
	// topics are --topics: what to read, in the transport's words (stream
	// keys, queues, subjects); empty for a transport that is sent to.
	topics      []string
	group       string
	concurrency int
}

// consumeRunner is a transport's consumer.
type consumeRunner interface {
	Run(ctx context.Context) error
	Stats() consumer.DispatcherStats
}

// openedConsumer is a consumer ready to run: ping checks its server
// before it starts, close releases its connections after it stopped.
type openedConsumer struct {
	run   consumeRunner
	ping  func(ctx context.Context) error
	close func()
}

// consumeOpener opens the consumer a --sink URL of its scheme names.
type consumeOpener func(ctx context.Context, u *url.URL, env consumeEnv) (openedConsumer, error)

// consumeSchemes maps --sink schemes to their consumers; Kafka's is the
// group consumer of consume.go, on --brokers or kafka://.
var consumeSchemes = map[string]consumeOpener{
	"redis":  consumeRedis,
	"rediss": consumeRedis,
	"http":   consumeWebhook,
	"amqp":   consumeAMQP,
	"amqps":  consumeAMQP,
	"nats":   consumeNATS,
}

// kafkaOnlyConsumeFlags are consume's flags only the Kafka consumer reads.
var kafkaOnlyConsumeFlags = []string{"brokers", "tls", "tls-ca", "tls-cert", "tls-key", "tls-insecure",
	"sasl-mechanism", "sasl-user", "sasl-password", "batch-size"}

// sinkConsumer finds the opener of --sink, or nil for Kafka (--brokers,
// or kafka:// whose brokers it puts in o.kf), refusing the Kafka flags
// beside another scheme.
func (o *consumeOptions) sinkConsumer(f *pflag.FlagSet) (*url.URL, consumeOpener, error) {
	if o.sinkURL == "" {
		return nil, nil, nil
	}
	u, err := url.Parse(o.sinkURL)
	if err != nil || u.Scheme == "" {
		return nil, nil, fmt.Errorf("--sink %q is not a URL; write scheme://host:port, with the scheme one of kafka, %s", redactURL(o.sinkURL), consumeSchemeList())
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme == "kafka" {
		if u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || f.Changed("brokers") {
			return nil, nil, errors.New("--sink kafka://host:port[,host:port] takes brokers only, instead of --brokers; for TLS or SASL use --brokers and the --tls and --sasl flags")
		}
		o.kf.brokers = u.Host
		return nil, nil, nil
	}
	open, ok := consumeSchemes[scheme]
	if !ok {
		return nil, nil, fmt.Errorf("--sink: unknown scheme %q; use one of kafka, %s", u.Scheme, consumeSchemeList())
	}
	for _, name := range kafkaOnlyConsumeFlags {
		if f.Changed(name) {
			return nil, nil, fmt.Errorf("--%s is a Kafka flag, and --sink names a %s consumer; drop --%s", name, u.Scheme, name)
		}
	}
	return u, open, nil
}

func consumeSchemeList() string {
	names := make([]string, 0, len(consumeSchemes))
	for s := range consumeSchemes {
		names = append(names, s)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// runSinkConsume is runConsume for a transport other than Kafka.
func runSinkConsume(ctx context.Context, g *globals, out io.Writer, o *consumeOptions, u *url.URL, open consumeOpener) error {
	log, err := g.logger()
	if err != nil {
		return err
	}
	t, err := g.tables()
	if err != nil {
		return err
	}
	p, err := o.prepareOutput(out)
	if err != nil {
		return err
	}
	topics, err := sinkTopics(o.topics)
	if err != nil {
		return err
	}
	name, group := consumeNames(o.cfg.Name, o.cfg.Group)
	var conns int32
	if o.cfg.Concurrency > 0 {
		conns = int32(o.cfg.Concurrency) + 1
	}
	pool, err := g.connect(ctx, conns)
	if err != nil {
		return err
	}
	defer pool.Close()
	env := consumeEnv{log: log, topics: topics, group: group, concurrency: o.cfg.Concurrency,
		disp: consumer.DispatcherConfig{Name: name, Pool: pool, Tables: t, DefaultHandler: p.handle, Middleware: o.cfg.Middleware, Logger: log}}
	c, err := open(ctx, u, env)
	if err != nil {
		return err
	}
	defer c.close()
	if err := checkSchema(ctx, pool, t); err != nil {
		return err
	}
	if err := c.ping(ctx); err != nil {
		return err
	}
	if o.httpAddr != "" {
		m := consumermetrics.New(name, func() consumer.Stats { return dispatcherStats(c.run.Stats()) })
		h := m.Handler(consumermetrics.ReadyCheck{Name: "database", Check: pool.Ping}, consumermetrics.ReadyCheck{Name: "broker", Check: c.ping})
		_, stop, err := serveHTTP(o.httpAddr, h, log, "/metrics /healthz /readyz")
		if err != nil {
			return err
		}
		defer stop()
	}
	run, stop := context.WithCancel(ctx)
	defer stop()
	p.onWriteError = stop
	if err := c.run.Run(run); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	st := c.run.Stats()
	log.Info("consume stopped", "processed", st.Processed, "duplicates", st.Duplicates,
		"dead_lettered", st.DeadLettered, "malformed", st.Malformed, "retries", st.Retries)
	return p.err()
}

// dispatcherStats are a transport consumer's counters as the metrics
// read them.
func dispatcherStats(s consumer.DispatcherStats) consumer.Stats {
	return consumer.Stats{Processed: s.Processed, Duplicates: s.Duplicates, DeadLettered: s.DeadLettered,
		Malformed: s.Malformed, Retries: s.Retries, Records: s.Processed + s.Duplicates + s.DeadLettered}
}

// sinkTopics splits --topics for a transport whose names are not Kafka's.
func sinkTopics(s string) ([]string, error) {
	var topics []string
	for t := range strings.SplitSeq(s, ",") {
		if t = strings.TrimSpace(t); t != "" {
			topics = append(topics, t)
		}
	}
	return topics, nil
}

// consumeRedis consumes the Redis sink's streams (--topics: the stream
// keys, the relay's topics) in consumer group --group.
func consumeRedis(_ context.Context, u *url.URL, env consumeEnv) (openedConsumer, error) {
	if _, has := u.User.Password(); has {
		return openedConsumer{}, fmt.Errorf("--sink %s holds a password; drop it from the URL and set %s instead (a flag's value shows in ps and shell history)", u.Redacted(), redisPasswordEnv)
	}
	if len(env.topics) == 0 {
		return openedConsumer{}, errors.New("no streams: pass --topics with the stream keys to read, comma-separated (the relay's topics, e.g. --topics order)")
	}
	opts, _, err := redispub.ParseURL(u.String(), redispub.Config{})
	if err != nil {
		return openedConsumer{}, fmt.Errorf("--sink: %w", err)
	}
	if pw := os.Getenv(redisPasswordEnv); pw != "" {
		opts.Password = pw
	}
	client := redis.NewClient(opts)
	c, err := redisconsumer.New(redisconsumer.Config{Client: client, Streams: env.topics, Dispatcher: env.disp,
		Group: env.group, Concurrency: env.concurrency})
	if err != nil {
		client.Close()
		return openedConsumer{}, err
	}
	addr := opts.Addr
	return openedConsumer{run: c, close: func() { client.Close() }, ping: func(ctx context.Context) error {
		if err := client.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("cannot reach redis at %s: %w; is redis-server running there (and %s set when it needs a password)?", addr, err, redisPasswordEnv)
		}
		return nil
	}}, nil
}

// consumeWebhook serves the webhook sink's receiving endpoint at the
// --sink URL's host:port and path (http only: put TLS in front of it),
// verifying each request with the relay's secrets ($OUTBOX_WEBHOOK_SECRET
// or ?secret_file=). A request for another path is answered 404.
func consumeWebhook(_ context.Context, u *url.URL, env consumeEnv) (openedConsumer, error) {
	if u.User != nil {
		return openedConsumer{}, errors.New("--sink: a webhook URL takes no user or password; requests are authenticated by their signatures")
	}
	if len(env.topics) > 0 {
		return openedConsumer{}, errors.New("--topics does not apply to a webhook endpoint: the relay sends to it; route types to endpoints in the relay's routes file")
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return openedConsumer{}, fmt.Errorf("--sink %s: give the address to listen on as host:port, e.g. http://127.0.0.1:8080/outbox", u.Redacted())
	}
	secrets, err := webhookSecrets(u.Query().Get("secret_file"))
	if err != nil {
		return openedConsumer{}, err
	}
	env.disp.System = "webhook"
	disp, err := consumer.NewDispatcher(env.disp)
	if err != nil {
		return openedConsumer{}, err
	}
	v, err := webhookconsumer.NewVerifier(webhookconsumer.VerifierConfig{Secrets: secrets})
	if err != nil {
		return openedConsumer{}, fmt.Errorf("--sink: %w", err)
	}
	h, err := webhookconsumer.NewHandler(webhookconsumer.HandlerConfig{Dispatcher: disp, Verifier: v, Logger: env.log})
	if err != nil {
		return openedConsumer{}, err
	}
	path := u.Path
	if path == "" {
		path = "/"
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+path, h)
	srv := &webhookServer{addr: u.Host, path: path, disp: disp, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, log: env.log}
	return openedConsumer{run: srv, close: func() {}, ping: func(context.Context) error { return nil }}, nil
}

// webhookServer runs the webhook receiver until its context ends.
type webhookServer struct {
	addr, path string
	disp       *consumer.Dispatcher
	srv        *http.Server
	log        *slog.Logger
}

func (s *webhookServer) Stats() consumer.DispatcherStats { return s.disp.Stats() }

func (s *webhookServer) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s for webhooks: %w (is another process using the port? pick another)", s.addr, err)
	}
	s.log.Info("receiving webhooks", "addr", ln.Addr().String(), "path", s.path)
	done := make(chan error, 1)
	go func() { done <- s.srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	// Requests in flight finish (their transactions commit, their 2xx is
	// sent); the relay retries the ones that do not.
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(sctx)
	<-done
	return nil
}
