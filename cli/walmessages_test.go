package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay/walrelay"
)

// --messages belongs to --mode wal; with --setup-only it revokes
// pg_logical_emit_message from PUBLIC (the tests' role is a superuser),
// which the relay with --messages requires, and says what to grant: the
// producers the emit function, pg_logical_emit_message only the relay.
func TestSetupOnlyMessagesRevokesEmitMessageFromPublic(t *testing.T) {
	t.Parallel()
	var out, errOut strings.Builder
	require.Equal(t, 1, Main([]string{"relay", "--messages"}, &out, &errOut))
	require.Contains(t, errOut.String(), "--messages belongs to --mode wal")

	server := switchCluster(t) // a cluster of its own: this changes a cluster-wide privilege
	db, _ := switchDB(t, server)
	publicCan := func() bool {
		var can bool
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			`SELECT has_function_privilege('public', 'pg_logical_emit_message(boolean,text,text)', 'EXECUTE')`).Scan(&can))
		return can
	}
	require.True(t, publicCan(), "Postgres grants it to PUBLIC")
	code, stdout, stderr := runCLI(t, db, "relay", "--mode", "wal", "--setup-only", "--messages")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "message-mode events: ran REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean,text,bytea) FROM PUBLIC; REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean,text,text) FROM PUBLIC;")
	require.Contains(t, stdout, "GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean,text,bytea), pg_catalog.pg_logical_emit_message(boolean,text,text) TO <role>;")
	require.Contains(t, stdout, "GRANT EXECUTE ON FUNCTION "+walrelay.EmitMessageFunc(db.Tables)+" TO <producers' role>;")
	require.Contains(t, stdout, "outbox relay --mode wal --messages")
	require.NotContains(t, stdout, "would refuse to start")
	require.False(t, publicCan())
}
