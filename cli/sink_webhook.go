package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/outbox/relay/webhookpub"
)

// webhookSecretEnv holds the webhook signing secrets when the --sink URL
// names no secret_file.
const webhookSecretEnv = "OUTBOX_WEBHOOK_SECRET"

// webhookOptions are the query parameters of an http(s) --sink URL that
// are the relay's, not the endpoint's: they are taken out of the URL
// before it becomes the default endpoint.
var webhookOptions = []string{"routes", "ca", "secret_file", "max_bytes", "concurrency", "request_timeout"}

// openWebhookURL opens the Standard Webhooks sink for
// https://host/path?routes=FILE&ca=FILE&secret_file=FILE&max_bytes=N&concurrency=N&request_timeout=D:
// the URL, without those parameters, is the endpoint of every event the
// routes file does not route elsewhere. The secrets come from secret_file
// or $OUTBOX_WEBHOOK_SECRET, never from the URL.
func openWebhookURL(_ context.Context, u *url.URL, env sinkEnv) (openedSink, error) {
	cfg, err := webhookConfig(u, env)
	if err != nil {
		return openedSink{}, err
	}
	pub, err := webhookpub.New(cfg)
	if err != nil {
		return openedSink{}, fmt.Errorf("--sink: %w", err)
	}
	for _, e := range pub.Endpoints() {
		if strings.HasPrefix(e, "http://") {
			env.log.Warn("webhook endpoint is plain http: requests (signed, not encrypted) travel in clear", "endpoint", webhookLogURL(e))
		}
	}
	return openedSink{sink: pub, ping: pub.Ping, close: func() {}}, nil
}

// webhookLogURL is an endpoint fit for a log: no credentials, no query.
func webhookLogURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparseable URL>"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

// webhookConfig reads the sink's settings out of its --sink URL.
func webhookConfig(u *url.URL, env sinkEnv) (webhookpub.Config, error) {
	if u.User != nil {
		return webhookpub.Config{}, errors.New("--sink: a webhook URL takes no user or password; endpoints authenticate requests by their signatures (secrets in $" + webhookSecretEnv + " or ?secret_file=)")
	}
	q := u.Query()
	for k := range q {
		if strings.Contains(strings.ToLower(k), "secret") && k != "secret_file" {
			return webhookpub.Config{}, fmt.Errorf("--sink: query parameter %q: secrets never go in the URL; put them in $%s or a file named by ?secret_file=", k, webhookSecretEnv)
		}
	}
	cfg := webhookpub.Config{Source: env.source, DeliveryTimeout: env.deliver, CAFile: q.Get("ca"), Logger: env.log, CloudEvents: env.ce}
	var err error
	if cfg.Secrets, err = webhookSecrets(q.Get("secret_file")); err != nil {
		return cfg, err
	}
	if cfg.MaxBytes, err = queryInt(q, "max_bytes"); err != nil {
		return cfg, err
	}
	if cfg.Concurrency, err = queryInt(q, "concurrency"); err != nil {
		return cfg, err
	}
	if v := q.Get("request_timeout"); v != "" {
		if cfg.RequestTimeout, err = time.ParseDuration(v); err != nil || cfg.RequestTimeout <= 0 {
			return cfg, fmt.Errorf("--sink: request_timeout=%q: write a positive duration, e.g. 10s", v)
		}
	}
	if f := q.Get("routes"); f != "" {
		if cfg.Routes, err = readWebhookRoutes(f); err != nil {
			return cfg, err
		}
	}
	endpoint := *u
	for _, k := range webhookOptions {
		q.Del(k)
	}
	endpoint.RawQuery = q.Encode()
	cfg.Endpoint = endpoint.String()
	if def, ok := cfg.Routes["*"]; ok {
		// "* -": no default; an event without a route of its own is held.
		cfg.Endpoint = strings.TrimPrefix(def, "-")
		delete(cfg.Routes, "*")
	}
	return cfg, nil
}

func queryInt(q url.Values, name string) (int, error) {
	v := q.Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("--sink: %s=%q: write a positive whole number", name, v)
	}
	return n, nil
}

// webhookSecrets reads the signing secrets from file, else from
// $OUTBOX_WEBHOOK_SECRET: one or more, separated by spaces, commas or
// lines (the new and the old during a rotation).
func webhookSecrets(file string) ([]webhookpub.Secret, error) {
	src, raw := "$"+webhookSecretEnv, os.Getenv(webhookSecretEnv)
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--sink: secret_file: %w", err)
		}
		src, raw = "secret_file "+file, string(b)
	}
	if strings.TrimSpace(raw) == "" {
		return nil, fmt.Errorf("--sink: a webhook sink needs a signing secret: set $%s to whsec_... (or name a file with ?secret_file=); make one with: echo whsec_$(head -c 32 /dev/urandom | base64)", webhookSecretEnv)
	}
	s, err := webhookpub.ParseSecrets(raw)
	if err != nil {
		return nil, fmt.Errorf("--sink: %s: %w", src, err)
	}
	return s, nil
}

// readWebhookRoutes reads a routes file: one route a line, an event type
// or a topic, white space, then the endpoint URL; "*" routes everything
// else ("* -": nothing else is routed); '#' starts a comment.
func readWebhookRoutes(file string) (map[string]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("--sink: routes: %w", err)
	}
	defer f.Close()
	routes := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("--sink: routes file %s, line %d: write a type or topic, then one URL (e.g. \"order.placed https://hooks.example.com/orders\")", file, n)
		}
		if _, dup := routes[fields[0]]; dup {
			return nil, fmt.Errorf("--sink: routes file %s, line %d: %q is routed twice", file, n, fields[0])
		}
		routes[fields[0]] = fields[1]
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--sink: routes file %s: %w", file, err)
	}
	return routes, nil
}
