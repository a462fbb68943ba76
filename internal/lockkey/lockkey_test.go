package lockkey_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/lockkey"
)

// Keys differ per table, and the two-key namespaces (Emit's and cleanup's)
// never meet, over every table of a few schemas: a collision would make an
// Emit wait on a cleanup, or two outboxes serialise on each other.
func TestKeysDifferPerTableAndKind(t *testing.T) {
	t.Parallel()
	twoKey := map[int32]string{}
	mig := map[int64]string{}
	for _, schema := range []string{"public", "plan_x", "billing", "s1"} {
		for _, table := range []string{"events_outbox", "orders_outbox", "outbox", "events_outbox2", "t"} {
			name := schema + "." + table
			for kind, k := range map[string]int32{"emit": lockkey.Emit(schema, table), "cleanup": lockkey.Cleanup(schema, table)} {
				prev, dup := twoKey[k]
				require.False(t, dup, "%s lock of %s has key %d, as %s", kind, name, k, prev)
				twoKey[k] = kind + " " + name
			}
			k := lockkey.Migration(schema, table)
			prev, dup := mig[k]
			require.False(t, dup, "migration lock of %s has key %d, as %s", name, k, prev)
			mig[k] = name
		}
	}
}

// The keys are part of the contract between versions: a relay and an
// Emit of different builds must take the same locks. Pinned for the
// default table.
func TestKeysAreStable(t *testing.T) {
	t.Parallel()
	require.Equal(t, int32(1187002454), lockkey.Emit("public", "events_outbox"))
	require.Equal(t, int64(5098136720208914791), lockkey.Migration("public", "events_outbox"))
	require.Equal(t, int32(-382319343), lockkey.Cleanup("public", "events_outbox"))
	require.Equal(t, int32(865386460), lockkey.Cleanup("plan_x", "orders_outbox"))
	var id [16]byte
	copy(id[:], []byte{0x6b, 0xa7, 0xb8, 0x10, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8})
	require.Equal(t, int32(156), lockkey.Bucket(id, 1024))
}
