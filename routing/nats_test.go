package routing_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/routing"
)

func TestNATSDestination(t *testing.T) {
	t.Parallel()
	got, err := routing.NATS{}.Destination("order.placed")
	require.NoError(t, err)
	require.Equal(t, "order.placed", got)
	got, err = routing.NATS{TopicPrefix: "shop."}.Destination("order.placed")
	require.NoError(t, err)
	require.Equal(t, "shop.order.placed", got)
	got, err = routing.NATS{}.Destination("single")
	require.NoError(t, err)
	require.Equal(t, "single", got)

	for typ, why := range map[string]string{
		"":              "the type is empty",
		".placed":       "starts with '.'",
		"order.":        "ends with '.'",
		"order..placed": `has an empty token ("..")`,
		"order.*":       `holds '*', a wildcard`,
		"order.>":       `holds '>', a wildcard`,
		"order.pl*aced": `holds '*', a wildcard`,
		"order placed":  "holds whitespace",
		"order.\tx":     "holds whitespace",
		"order.\x01":    "holds a control character",
		"order.\xff":    "is not valid UTF-8",
	} {
		_, err := routing.NATS{}.Destination(typ)
		require.True(t, errors.Is(err, outbox.ErrInvalidTopic), "%q: %v", typ, err)
		require.ErrorContains(t, err, why, "%q", typ)
		if typ != "" {
			require.ErrorContains(t, err, `e.g. "order.placed"`, "the error says how to name the type")
		}
	}
}

func TestNATSValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, routing.NATS{}.Validate())
	require.NoError(t, routing.NATS{TopicPrefix: "shop.", MaxPayloadBytes: 8 << 20}.Validate())
	require.ErrorContains(t, routing.NATS{TopicPrefix: "shop.*."}.Validate(), `TopicPrefix "shop.*." cannot start a NATS subject`)
	require.ErrorContains(t, routing.NATS{TopicPrefix: "shop.."}.Validate(), "empty token")
	require.ErrorContains(t, routing.NATS{MaxPayloadBytes: 100}.Validate(), "MaxPayloadBytes is 100; the smallest event makes a NATS message of")
	require.Equal(t, routing.DefaultNATSMaxPayloadBytes, routing.NATS{}.Limit().Bytes)
	require.Equal(t, 5000, routing.NATS{MaxPayloadBytes: 5000}.Limit().Bytes)
}

// Emit refuses with routing.NATS what the NATS sink would refuse, in its
// words.
func TestNATSRoutingInEmit(t *testing.T) {
	t.Parallel()
	r := routing.NATS{MaxPayloadBytes: 2000}
	cfg := outbox.Config{Routing: r}
	require.NoError(t, cfg.Validate())
	size := r.Size("order.placed", 1500, map[string]string{"k": "v"})
	require.Greater(t, size, 1500+200+19, "counts the longest source and id, twice (event_source, Nats-Msg-Id)")
	require.Less(t, r.Size("order.placed", 10, nil), 2000)
}

// Size is at least MessageSize for any id and source Emit allows.
func TestNATSSizeBoundsMessageSize(t *testing.T) {
	t.Parallel()
	h := map[string]string{"odd key": " x ", "plain": "v"}
	most := routing.NATS{}.Size("t.e", 100, h)
	for _, src := range []string{"", "s", strings.Repeat("s", outbox.MaxSourceLen)} {
		for _, id := range []int64{1, 1 << 62} {
			require.LessOrEqual(t, routing.NATS{}.MessageSize(id, "t.e", 100, h, src), most)
		}
	}
	require.Equal(t, most, routing.NATS{}.MessageSize(0, "t.e", 100, h, strings.Repeat("s", outbox.MaxSourceLen)))
}

func TestNATSHeaderEscape(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, value, wantName, wantValue string }{
		{"plain", "Grüße, 東京", "plain", "Grüße, 東京"},
		{"empty", "", "empty", ""},
		{"space in name", "v", "~space%20in%20name", "v"},
		{"k", " padded ", "~k", "%20padded%20"},
		{"k", "a\r\nb", "~k", "a%0D%0Ab"},
		{"~k", "v", "~~k", "v"},
		{"Nats-Msg-Id", "1", "~Nats-Msg-Id", "1"},
		{"nats-expected-stream", "S", "~nats-expected-stream", "S"},
		{"a:b", "100%", "~a%3Ab", "100%25"},
	} {
		n, v := routing.EscapeNATSHeader(tc.name, tc.value)
		require.Equal(t, tc.wantName, n, tc.name)
		require.Equal(t, tc.wantValue, v, tc.name)
		back, bv, err := routing.UnescapeNATSHeader(n, v)
		require.NoError(t, err)
		require.Equal(t, tc.name, back)
		require.Equal(t, tc.value, bv)
	}
	_, _, err := routing.UnescapeNATSHeader("~a%2", "v")
	require.ErrorContains(t, err, "truncated escape")
	_, _, err = routing.UnescapeNATSHeader("~a", "%zz")
	require.ErrorContains(t, err, "bad escape")
}

func FuzzNATSHeaderEscape(f *testing.F) {
	f.Add("ключ", " значение ")
	f.Fuzz(func(t *testing.T, name, value string) {
		n, v := routing.EscapeNATSHeader(name, value)
		back, bv, err := routing.UnescapeNATSHeader(n, v)
		if err != nil || back != name || bv != value {
			t.Fatalf("%q=%q escaped as %q=%q came back as %q=%q (%v)", name, value, n, v, back, bv, err)
		}
	})
}
