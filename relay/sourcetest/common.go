package sourcetest

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay"
)

// BadCommon is a relay.Common no source may start with, and what its
// error says.
type BadCommon struct {
	Name string
	Mod  func(*relay.Common)
	Want []string
}

// BadCommons are the values of relay.Common every source refuses, in
// Common.Validate's words.
var BadCommons = []BadCommon{
	{"nil pool", func(c *relay.Common) { c.Pool = nil }, []string{"Config.Pool is nil", "pgxpool.Pool"}},
	{"nil sink", func(c *relay.Common) { c.Sink = nil }, []string{"Config.Sink is nil", "kafkapub.NewPublisher"}},
	{"negative backoff min", func(c *relay.Common) { c.BackoffMin = -time.Millisecond }, []string{"BackoffMin is -1ms", "positive duration", "0 for the default"}},
	{"negative backoff max", func(c *relay.Common) { c.BackoffMax = -time.Second }, []string{"BackoffMax is -1s"}},
	{"negative shutdown timeout", func(c *relay.Common) { c.ShutdownTimeout = -time.Second }, []string{"ShutdownTimeout is -1s"}},
	{"backoff max below min", func(c *relay.Common) { c.BackoffMin, c.BackoffMax = time.Second, time.Millisecond }, []string{"BackoffMax (1ms) is below BackoffMin (1s)", "raise BackoffMax"}},
	{"backoff max below the default min", func(c *relay.Common) { c.BackoffMax = time.Millisecond }, []string{"BackoffMax (1ms) is below BackoffMin (100ms)"}},
	{"negative batch size", func(c *relay.Common) { c.BatchSize = -1 }, []string{"BatchSize is -1", "1 to 100000", "0 for the default 5000"}},
	{"huge batch size", func(c *relay.Common) { c.BatchSize = 100_001 }, []string{"BatchSize is 100001"}},
	{"negative batch bytes", func(c *relay.Common) { c.MaxBatchBytes = -1 }, []string{"MaxBatchBytes is -1", "0 for the default 4 MiB"}},
	{"topic prefix with a space", func(c *relay.Common) { c.TopicPrefix = "my prefix." }, []string{`topic prefix "my prefix."`, "letters, digits"}},
	{"topic prefix with a slash", func(c *relay.Common) { c.TopicPrefix = "prod/" }, []string{`topic prefix "prod/"`}},
	{"topic prefix too long", func(c *relay.Common) { c.TopicPrefix = strings.Repeat("p", 249) }, []string{"topic prefix", "at most 249"}},
	{"bad table name", func(c *relay.Common) { c.Tables = outbox.Tables{Outbox: "events; DROP TABLE x"} }, []string{"not a plain identifier"}},
	{"bad schema name", func(c *relay.Common) { c.Tables = outbox.Tables{Schema: "My-Schema"} }, []string{`schema name "My-Schema"`}},
	{"nil hook", func(c *relay.Common) { c.Hooks = []relay.Hook{nil} }, []string{"Config.Hooks[0] is nil"}},
	{"hook of no kind", func(c *relay.Common) { c.Hooks = []relay.Hook{42} }, []string{"Config.Hooks[0] (int) implements none of"}},
}

// RefusesBadCommons checks that a source's constructor refuses every
// BadCommons value with Common.Validate's own message: newSource builds
// the source from c and returns New's error. pool and pub make a Common
// it accepts.
func RefusesBadCommons(t *testing.T, pool *pgxpool.Pool, pub relay.Sink, newSource func(relay.Common) error) {
	good := relay.Common{Pool: pool, Sink: pub}
	require.NoError(t, good.Validate())
	require.NoError(t, newSource(good))
	for _, tc := range BadCommons {
		t.Run(tc.Name, func(t *testing.T) {
			c := good
			tc.Mod(&c)
			want := c.Validate()
			require.Error(t, want)
			for _, w := range tc.Want {
				require.Contains(t, want.Error(), w)
			}
			err := newSource(c)
			require.Error(t, err)
			require.Equal(t, want.Error(), err.Error(), "the source words a shared field's error as Common.Validate does")
		})
	}
}
