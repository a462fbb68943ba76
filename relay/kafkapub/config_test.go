package kafkapub_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay/kafkapub"
)

func TestPublisherConfigWithDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	d := kafkapub.PublisherConfig{}.WithDefaults()
	require.NotNil(t, d.Logger)
	require.NoError(t, d.Validate())
	require.NoError(t, kafkapub.PublisherConfig{Source: strings.Repeat("s", 200), MaxMessageBytes: 1 << 20}.Validate())
	for _, tc := range []struct {
		cfg  kafkapub.PublisherConfig
		want string
	}{
		{kafkapub.PublisherConfig{Source: strings.Repeat("s", 201)}, "kafkapub: Source: use at most 200 bytes of UTF-8 text without NUL"},
		{kafkapub.PublisherConfig{Source: "a\x00b"}, "kafkapub: Source: use at most 200 bytes"},
		{kafkapub.PublisherConfig{MaxMessageBytes: -1}, "kafkapub: MaxMessageBytes is -1; use a positive size in bytes, or 0 to ask the broker"},
	} {
		require.ErrorContains(t, tc.cfg.WithDefaults().Validate(), tc.want)
	}
}
