package outbox

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is the database handle the packages that read or manage an outbox
// take (ops, ops/switchover, migrate, the WAL source's setup): a
// *pgxpool.Pool, *pgx.Conn or *pgxpool.Conn, or a pgx.Tx, in which case
// what a function would commit runs in a savepoint and commits only with
// the caller's transaction. Emit takes a transaction instead, never a DB.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
