package migrate_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
)

// An id sequence that caches ids lets a session insert an id lower than
// ones committed before it: Validate, which both relay sources run at
// start, refuses it and says what to run; CACHE 1 passes again.
func TestValidateRefusesACachingIDSequence(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string]pgtest.Options{
		"plain":       {},
		"partitioned": {Partitioned: true, PartitionWidth: 1000},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, opts)
			ctx := context.Background()
			m, err := migrate.New(db.Tables)
			require.NoError(t, err)
			require.NoError(t, m.Validate(ctx, db.Pool))

			seq := db.Tables.Schema + "." + db.Tables.Outbox + "_id_seq"
			_, err = db.Pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 20")
			require.NoError(t, err)
			err = m.Validate(ctx, db.Pool)
			require.ErrorIs(t, err, migrate.ErrSequenceCached)
			require.ErrorContains(t, err, "has CACHE 20")
			require.ErrorContains(t, err, "ALTER SEQUENCE "+seq+" CACHE 1")

			_, err = db.Pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 1")
			require.NoError(t, err)
			require.NoError(t, m.Validate(ctx, db.Pool))
		})
	}
}
