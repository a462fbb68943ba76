package ops_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/ops"
)

// Every config of the operator verbs fills its named defaults and refuses
// each bad value with a message naming it.
func TestConfigsWithDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	tables := outbox.Tables{}.WithDefaults()

	c := ops.CleanupConfig{}.WithDefaults()
	require.Equal(t, tables, c.Tables)
	require.Equal(t, ops.DefaultRetention, c.Retention)
	require.Equal(t, ops.DefaultProcessedRetention, c.ProcessedRetention)
	require.Equal(t, ops.DefaultCleanupBatch, c.BatchSize)
	require.Equal(t, ops.DefaultCleanupPause, c.Pause)
	require.Equal(t, ops.DefaultWALConfirmWait, c.WALConfirmWait)
	require.NotNil(t, c.Logger)
	require.Equal(t, ops.DefaultStuckAfter, ops.StatsConfig{}.WithDefaults().StuckAfter)
	require.Equal(t, ops.DefaultPreviewBytes, ops.ShowConfig{}.WithDefaults().PreviewBytes)
	require.Equal(t, -1, ops.ShowConfig{PreviewBytes: -1}.WithDefaults().PreviewBytes, "negative: the whole payload")
	require.Equal(t, ops.DefaultReplayChunk, ops.ReplayConfig{}.WithDefaults().ChunkSize)
	require.Equal(t, ops.DefaultParkLockTimeout, ops.ParkConfig{}.WithDefaults().LockTimeout)
	require.NotNil(t, ops.RetryConfig{}.WithDefaults().Logger)
	require.NotNil(t, ops.ReplayConfig{}.WithDefaults().Logger)
	require.NotNil(t, ops.ParkConfig{}.WithDefaults().Logger)
	require.NotNil(t, ops.UnparkConfig{}.WithDefaults().Logger)
	for _, tb := range []outbox.Tables{
		ops.StatsConfig{}.WithDefaults().Tables, ops.ShowConfig{}.WithDefaults().Tables,
		ops.RetryConfig{}.WithDefaults().Tables, ops.ReplayConfig{}.WithDefaults().Tables,
		ops.ParkConfig{}.WithDefaults().Tables, ops.UnparkConfig{}.WithDefaults().Tables,
	} {
		require.Equal(t, tables, tb)
	}

	bad := outbox.Tables{Outbox: "a;b"}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"cleanup tables", ops.CleanupConfig{Tables: bad}.Validate(), "not a plain identifier"},
		{"cleanup batch", ops.CleanupConfig{BatchSize: 1_000_001}.Validate(), "ops: cleanup BatchSize is 1000001; use 1 to 1000000, or 0 for the default 10000"},
		{"cleanup retention", ops.CleanupConfig{Retention: -time.Second}.Validate(), "ops: cleanup Retention is -1s; use a positive duration, or 0 for the default 168h0m0s"},
		{"cleanup processed", ops.CleanupConfig{ProcessedRetention: -time.Second}.Validate(), "ops: cleanup ProcessedRetention is -1s"},
		{"cleanup pause", ops.CleanupConfig{Pause: -time.Second}.Validate(), "ops: cleanup Pause is -1s"},
		{"cleanup wal wait", ops.CleanupConfig{WALConfirmWait: -time.Second}.Validate(), "ops: cleanup WALConfirmWait is -1s; use a positive duration, or 0 for the default 1m0s"},
		{"stats tables", ops.StatsConfig{Tables: bad}.Validate(), "not a plain identifier"},
		{"stats stuck", ops.StatsConfig{StuckAfter: -time.Second}.Validate(), "ops: stats StuckAfter is -1s; use a positive duration, or 0 for the default 5m0s"},
		{"show tables", ops.ShowConfig{Tables: bad, ID: 1}.Validate(), "not a plain identifier"},
		{"show id", ops.ShowConfig{}.Validate(), "ops: event id 0: ids are positive"},
		{"retry tables", ops.RetryConfig{Tables: bad, EventID: 1}.Validate(), "not a plain identifier"},
		{"retry neither", ops.RetryConfig{}.Validate(), "ops: retry needs either an event id or an aggregate id, not both and not neither"},
		{"retry both", ops.RetryConfig{EventID: 1, AggregateID: uuid.New()}.Validate(), "not both and not neither"},
		{"retry id", ops.RetryConfig{EventID: -1}.Validate(), "ops: event id -1: ids are positive"},
		{"replay tables", ops.ReplayConfig{Tables: bad, FromID: 1, ToID: 1}.Validate(), "not a plain identifier"},
		{"replay range", ops.ReplayConfig{ToID: 1}.Validate(), "ops: replay needs a range of ids, from 0 to 1"},
		{"replay inverted", ops.ReplayConfig{FromID: 2, ToID: 1}.Validate(), "ops: replay range from 2 to 1 is inverted"},
		{"replay chunk", ops.ReplayConfig{FromID: 1, ToID: 1, ChunkSize: -1}.Validate(), "ops: replay ChunkSize is -1; use 1 to 1000000, or 0 for the default 10000"},
		{"park tables", ops.ParkConfig{Tables: bad, ID: 1, Reason: "r"}.Validate(), "not a plain identifier"},
		{"park id", ops.ParkConfig{Reason: "r"}.Validate(), "ops: event id 0: ids are positive"},
		{"park reason", ops.ParkConfig{ID: 1, Reason: " "}.Validate(), "ops: park needs a reason"},
		{"park reason text", ops.ParkConfig{ID: 1, Reason: "a\x00b"}.Validate(), "write it as plain text"},
		{"park lock", ops.ParkConfig{ID: 1, Reason: "r", LockTimeout: -time.Second}.Validate(), "ops: park LockTimeout is -1s; use a positive duration, or 0 for the default 5s"},
		{"unpark tables", ops.UnparkConfig{Tables: bad, ID: 1}.Validate(), "not a plain identifier"},
		{"unpark id", ops.UnparkConfig{}.Validate(), "ops: event id 0: ids are positive"},
	} {
		require.ErrorContains(t, tc.err, tc.want, tc.name)
	}
	require.NoError(t, ops.ParkConfig{ID: 1, Reason: "r"}.WithDefaults().Validate())
	require.NoError(t, ops.ReplayConfig{FromID: 1, ToID: 2}.WithDefaults().Validate())
	require.NoError(t, ops.CleanupConfig{}.WithDefaults().Validate())
}
