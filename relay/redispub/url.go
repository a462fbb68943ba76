package redispub

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The query parameters of a sink URL that configure the Publisher; every
// other parameter is go-redis's own (dial_timeout, read_timeout,
// pool_size, ..., see redis.ParseURL).
const (
	// ParamMaxLen sets Config.MaxLen.
	ParamMaxLen = "maxlen"
	// ParamWait sets Config.Wait.
	ParamWait = "wait"
	// ParamWaitTimeout sets Config.WaitTimeout (a Go duration: 500ms).
	ParamWaitTimeout = "wait_timeout"
	// ParamMaxBytes sets Config.MaxBytes.
	ParamMaxBytes = "max_bytes"
)

// ParseURL reads a sink URL, redis://[user[:password]@]host[:port][/db]
// or rediss://... (TLS, the server's certificate verified), into the
// client's options and the Publisher's config (on top of cfg). The
// Publisher's parameters (maxlen, wait, wait_timeout, max_bytes) are taken
// out; the others go to redis.ParseURL. Its errors never hold the URL's
// password.
func ParseURL(raw string, cfg Config) (*redis.Options, Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, cfg, fmt.Errorf("redispub: the URL does not parse; write redis://host:6379/0")
	}
	if s := strings.ToLower(u.Scheme); s != "redis" && s != "rediss" {
		return nil, cfg, fmt.Errorf("redispub: scheme %q: use redis:// or rediss:// (TLS)", u.Scheme)
	}
	if u.Host == "" {
		return nil, cfg, fmt.Errorf("redispub: %s has no host; write %s://host:6379/0", u.Redacted(), u.Scheme)
	}
	q := u.Query()
	if cfg, err = takeParams(q, cfg); err != nil {
		return nil, cfg, err
	}
	u.RawQuery = q.Encode()
	opts, err := redis.ParseURL(u.String())
	if err != nil {
		// go-redis's errors quote parameters, never the userinfo.
		return nil, cfg, fmt.Errorf("redispub: %s: %w", u.Redacted(), err)
	}
	return opts, cfg, nil
}

// takeParams moves the Publisher's parameters from q into cfg.
func takeParams(q url.Values, cfg Config) (Config, error) {
	ints := []struct {
		name string
		set  func(int64)
	}{
		{ParamMaxLen, func(n int64) { cfg.MaxLen = n }},
		{ParamWait, func(n int64) { cfg.Wait = int(n) }},
		{ParamMaxBytes, func(n int64) { cfg.MaxBytes = int(n) }},
	}
	for _, p := range ints {
		if !q.Has(p.name) {
			continue
		}
		n, err := strconv.ParseInt(q.Get(p.name), 10, 32)
		if err != nil || n <= 0 {
			return cfg, fmt.Errorf("redispub: ?%s=%q: use a positive whole number", p.name, q.Get(p.name))
		}
		p.set(n)
		q.Del(p.name)
	}
	if q.Has(ParamWaitTimeout) {
		d, err := time.ParseDuration(q.Get(ParamWaitTimeout))
		if err != nil || d <= 0 {
			return cfg, fmt.Errorf("redispub: ?%s=%q: use a positive duration, e.g. 500ms", ParamWaitTimeout, q.Get(ParamWaitTimeout))
		}
		cfg.WaitTimeout = d
		q.Del(ParamWaitTimeout)
	}
	return cfg, nil
}
