package devkafka_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/devkafka"
)

func TestStartRejectsBadAddresses(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"nohostport":   "host:port",
		"0.0.0.0:9092": "concrete address",
		"127.0.0.1:x":  "not a port number",
	} {
		_, err := devkafka.Start(devkafka.Config{Listen: addr})
		require.ErrorContains(t, err, want, addr)
	}
	b, err := devkafka.Start(devkafka.Config{})
	require.NoError(t, err)
	defer b.Close()
	_, err = devkafka.Start(devkafka.Config{Listen: b.Addr()})
	require.ErrorContains(t, err, "cannot listen")
}
