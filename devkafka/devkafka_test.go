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

func TestConfigWithDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	d := devkafka.Config{}.WithDefaults()
	require.Equal(t, devkafka.DefaultListen, d.Listen)
	require.Equal(t, devkafka.DefaultPartitions, d.Partitions)
	require.NoError(t, d.Validate())
	require.NoError(t, devkafka.Config{}.Validate())
	for _, tc := range []struct {
		cfg  devkafka.Config
		want string
	}{
		{devkafka.Config{Listen: "nohostport"}, "host:port"},
		{devkafka.Config{Listen: "0.0.0.0:9092"}, "concrete address"},
		{devkafka.Config{Listen: "127.0.0.1:x"}, "not a port number"},
		{devkafka.Config{Partitions: -1}, "devkafka: Config.Partitions is -1; use a positive number"},
		{devkafka.Config{MaxMessageBytes: -1}, "devkafka: Config.MaxMessageBytes is -1; use a positive size, or 0 for the default 1048588"},
	} {
		require.ErrorContains(t, tc.cfg.Validate(), tc.want)
		_, err := devkafka.Start(tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}
