package natspub_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay/natspub"
)

func TestConfigWithDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	d := natspub.Config{}.WithDefaults()
	require.NotNil(t, d.Logger)
	require.Equal(t, natspub.DefaultMaxInFlight, d.MaxInFlight)
	require.NoError(t, d.Validate())
	require.NoError(t, natspub.Config{Source: strings.Repeat("s", 200), MaxPayloadBytes: 1 << 20}.Validate())
	for _, tc := range []struct {
		cfg  natspub.Config
		want string
	}{
		{natspub.Config{Source: strings.Repeat("s", 201)}, "natspub: Source: use at most 200 bytes of UTF-8 text without NUL"},
		{natspub.Config{Source: "a\x00b"}, "natspub: Source: use at most 200 bytes"},
		{natspub.Config{MaxPayloadBytes: -1}, "natspub: MaxPayloadBytes is -1; use a positive size in bytes, or 0 to ask the server"},
		{natspub.Config{AckTimeout: -time.Second}, "natspub: AckTimeout is -1s; use a positive duration"},
		{natspub.Config{MaxInFlight: -3}, "natspub: MaxInFlight is -3; use a positive number"},
	} {
		require.ErrorContains(t, tc.cfg.Validate(), tc.want)
	}
	_, err := natspub.New(nil, natspub.Config{})
	require.ErrorContains(t, err, "natspub: the connection is nil")
}
