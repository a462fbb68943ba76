package redispub_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay/redispub"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	opts, cfg, err := redispub.ParseURL("redis://127.0.0.1:6380/2?maxlen=1000&wait=1&wait_timeout=250ms&max_bytes=65536&dial_timeout=2s", redispub.Config{Source: "shop"})
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:6380", opts.Addr)
	require.Equal(t, 2, opts.DB)
	require.Equal(t, 2*time.Second, opts.DialTimeout)
	require.Nil(t, opts.TLSConfig)
	require.Equal(t, redispub.Config{Source: "shop", MaxLen: 1000, Wait: 1, WaitTimeout: 250 * time.Millisecond, MaxBytes: 65536}, cfg)

	opts, cfg, err = redispub.ParseURL("rediss://redis.example.com", redispub.Config{})
	require.NoError(t, err)
	require.Equal(t, "redis.example.com:6379", opts.Addr)
	require.NotNil(t, opts.TLSConfig, "rediss:// is TLS")
	require.False(t, opts.TLSConfig.InsecureSkipVerify)
	require.Equal(t, redispub.Config{}, cfg)
}

func TestParseURLRefuses(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"http://127.0.0.1:6379":             `scheme "http": use redis:// or rediss://`,
		"redis://":                          "has no host",
		"redis://127.0.0.1/0?maxlen=0":      `?maxlen="0": use a positive whole number`,
		"redis://127.0.0.1/0?maxlen=lots":   `?maxlen="lots"`,
		"redis://127.0.0.1/0?wait=-1":       `?wait="-1"`,
		"redis://127.0.0.1/0?wait_timeout=": `?wait_timeout="": use a positive duration`,
		"redis://127.0.0.1/0?max_bytes=x":   `?max_bytes="x"`,
		"redis://127.0.0.1/0?colour=blue":   "colour",
		"redis://127.0.0.1/x":               "database number",
		"redis://u:s3cret@127.0.0.1/0?no=1": "xxxxx",
	} {
		_, _, err := redispub.ParseURL(raw, redispub.Config{})
		require.ErrorContains(t, err, want, raw)
		require.NotContains(t, err.Error(), "s3cret")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  redispub.Config
		want string
	}{
		{redispub.Config{MaxLen: -1}, "MaxLen is -1"},
		{redispub.Config{Wait: -2}, "Wait is -2"},
		{redispub.Config{WaitTimeout: -time.Second}, "WaitTimeout is -1s"},
		{redispub.Config{MaxBytes: 10}, "MaxBytes is 10; use between"},
		{redispub.Config{MaxBytes: 1 << 30}, "proto-max-bulk-len"},
		{redispub.Config{Source: string(make([]byte, 201))}, "Source"},
	} {
		err := c.cfg.WithDefaults().Validate()
		require.ErrorContains(t, err, c.want)
		_, err = redispub.New(nil, c.cfg)
		require.ErrorContains(t, err, c.want, "New validates")
	}
	d := redispub.Config{}.WithDefaults()
	require.Equal(t, redispub.DefaultMaxBytes, d.MaxBytes)
	require.Equal(t, redispub.DefaultWaitTimeout, d.WaitTimeout)
	require.NoError(t, d.Validate())
}
