package webhookpub

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"
)

// Endpoints returns every endpoint URL the Publisher may send to, without
// duplicates.
func (p *Publisher) Endpoints() []string {
	var out []string
	if p.cfg.Endpoint != "" {
		out = append(out, p.cfg.Endpoint)
	}
	for _, u := range p.cfg.Routes {
		if !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}

// Ping connects to every endpoint (a TLS handshake for https, verifying
// its certificate as requests will), without sending a request: an
// endpoint need not answer anything but its webhooks.
func (p *Publisher) Ping(ctx context.Context) error {
	for _, raw := range p.Endpoints() {
		u, err := url.Parse(raw)
		if err != nil {
			return err
		}
		if err := p.dial(ctx, u); err != nil {
			return fmt.Errorf("webhook endpoint %s: %w", redact(raw), err)
		}
	}
	return nil
}

func (p *Publisher) dial(ctx context.Context, u *url.URL) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	if u.Scheme == "http" {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", host)
		if err != nil {
			return err
		}
		return c.Close()
	}
	var cfg *tls.Config
	if tr, ok := p.client.Transport.(*http.Transport); ok && tr.TLSClientConfig != nil {
		cfg = tr.TLSClientConfig.Clone()
	} else {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	cfg.ServerName = u.Hostname()
	c, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", host)
	if err != nil {
		return err
	}
	return c.Close()
}
