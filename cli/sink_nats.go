package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox/relay/natspub"
)

// Environment variables the NATS sink reads its credentials from: a
// secret never goes in --sink, which shows in process listings.
const (
	envNATSUser     = "OUTBOX_NATS_USER"
	envNATSPassword = "OUTBOX_NATS_PASSWORD"
	envNATSToken    = "OUTBOX_NATS_TOKEN"
)

// natsQuery are the settings --sink nats://... takes in its query.
var natsQuery = []string{"max_payload_bytes", "max_in_flight", "creds", "tls_ca", "name"}

// natsSinkConfig is what a nats:// --sink URL says.
type natsSinkConfig struct {
	servers []string
	opts    []nats.Option
	pub     natspub.Config
}

// natsConsumeQuery are the settings only `outbox consume --sink nats://`
// takes.
var natsConsumeQuery = []string{"stream"}

// parseNATSURL reads nats://host:port[,host:port...][?setting=value...];
// extra are settings the caller reads itself.
func parseNATSURL(u *url.URL, getenv func(string) string, extra ...string) (natsSinkConfig, error) {
	var c natsSinkConfig
	known := append(slices.Clone(natsQuery), extra...)
	if u.User != nil {
		return c, fmt.Errorf("--sink nats://...: put no user or password in the URL (it shows in process listings); set %s and %s, or %s, or ?creds=FILE", envNATSUser, envNATSPassword, envNATSToken)
	}
	if u.Host == "" || (u.Path != "" && u.Path != "/") {
		return c, fmt.Errorf("--sink nats://host:port[,host:port][?setting=value], e.g. nats://127.0.0.1:4222; settings: %s", strings.Join(natsQuery, ", "))
	}
	for _, h := range strings.Split(u.Host, ",") {
		c.servers = append(c.servers, "nats://"+h)
	}
	q := u.Query()
	for k := range q {
		if !slices.Contains(known, k) {
			return c, fmt.Errorf("--sink nats://...?%s=: unknown setting; use %s", k, strings.Join(known, ", "))
		}
	}
	for _, n := range []struct {
		key string
		dst *int
	}{{"max_payload_bytes", &c.pub.MaxPayloadBytes}, {"max_in_flight", &c.pub.MaxInFlight}} {
		if v := q.Get(n.key); v != "" {
			i, err := strconv.Atoi(v)
			if err != nil || i <= 0 {
				return c, fmt.Errorf("--sink nats://...?%s=%s: use a positive whole number", n.key, v)
			}
			*n.dst = i
		}
	}
	name := "outbox-relay"
	if v := q.Get("name"); v != "" {
		name = v
	}
	c.opts = append(c.opts, nats.Name(name))
	if v := q.Get("creds"); v != "" {
		if _, err := os.Stat(v); err != nil {
			return c, fmt.Errorf("--sink nats://...?creds=%s: %s; give the path of a .creds file (JWT and NKey seed)", v, oneLine(err.Error()))
		}
		c.opts = append(c.opts, nats.UserCredentials(v))
	}
	if v := q.Get("tls_ca"); v != "" {
		if _, err := os.Stat(v); err != nil {
			return c, fmt.Errorf("--sink nats://...?tls_ca=%s: %s; give the path of a PEM file of CA certificates", v, oneLine(err.Error()))
		}
		c.opts = append(c.opts, nats.RootCAs(v))
	}
	user, pass, token := getenv(envNATSUser), getenv(envNATSPassword), getenv(envNATSToken)
	switch {
	case token != "" && user != "":
		return c, fmt.Errorf("both %s and %s are set; set one way to authenticate", envNATSToken, envNATSUser)
	case token != "":
		c.opts = append(c.opts, nats.Token(token))
	case user != "":
		c.opts = append(c.opts, nats.UserInfo(user, pass))
	case pass != "":
		return c, fmt.Errorf("%s is set without %s; set both", envNATSPassword, envNATSUser)
	}
	return c, nil
}

// openNATSURL opens the NATS JetStream sink for nats://host:port.
func openNATSURL(_ context.Context, u *url.URL, env sinkEnv) (openedSink, error) {
	c, err := parseNATSURL(u, os.Getenv)
	if err != nil {
		return openedSink{}, err
	}
	log := env.clientLog().With("sink", "nats")
	v, release, err := env.conns.get(env.key, func() (any, func(), error) {
		nc, err := dialNATS(c, log)
		if err != nil {
			return nil, nil, fmt.Errorf("--sink %s: %s", u.Redacted(), oneLine(err.Error()))
		}
		return nc, nc.Close, nil
	})
	if err != nil {
		return openedSink{}, err
	}
	nc := v.(*nats.Conn)
	c.pub.Source, c.pub.AckTimeout, c.pub.Logger, c.pub.CloudEvents = env.source, env.deliver, env.log, env.ce
	pub, err := natspub.New(nc, c.pub)
	if err != nil {
		release()
		return openedSink{}, err
	}
	return openedSink{
		sink:  pub,
		ping:  func(ctx context.Context) error { return pingNATS(ctx, nc, u) },
		close: release,
	}, nil
}

// dialNATS connects to c's servers, and keeps reconnecting: up at start
// or not, the relay keeps trying, and its ping reports.
func dialNATS(c natsSinkConfig, log *slog.Logger) (*nats.Conn, error) {
	opts := append(c.opts,
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS connection lost; reconnecting", "url", nc.ConnectedUrlRedacted(), "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("NATS connection restored", "url", nc.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("NATS error", "error", err) }),
	)
	return nats.Connect(strings.Join(c.servers, ","), opts...)
}

// pingNATS checks that JetStream answers, with an error that says what to
// do.
func pingNATS(ctx context.Context, nc *nats.Conn, u *url.URL) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err == nil {
		_, err = js.AccountInfo(ctx)
	}
	if err != nil {
		return fmt.Errorf("cannot reach NATS JetStream at %s: %s; check --sink (the server must run with JetStream enabled: nats-server -js)", u.Redacted(), oneLine(err.Error()))
	}
	return nil
}
