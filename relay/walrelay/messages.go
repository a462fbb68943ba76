package walrelay

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// ErrMessagesOpen: Config.Messages is on, but roles other than the
// outbox's producers can write logical messages (pg_logical_emit_message
// is executable by PUBLIC, as Postgres ships it, or by a role that may not
// insert into the outbox table), so they could write its events.
var ErrMessagesOpen = errors.New("walrelay: roles other than the outbox's producers can write its event messages")

// emitMessageACLSQL reads, of pg_logical_emit_message's overloads (two
// on PG 15, text and bytea content; PG 17 adds a flush argument): all of
// them, those PUBLIC can execute, and the login roles other than
// superusers and this session's that can execute one but may not insert
// into the outbox table ($1). pg_roles is small: this is cheap.
const emitMessageACLSQL = `WITH f AS (
  SELECT p.oid, p.oid::regprocedure::text AS fn FROM pg_proc p
  WHERE p.proname = 'pg_logical_emit_message' AND p.pronamespace = 'pg_catalog'::regnamespace
)
SELECT coalesce((SELECT array_agg('pg_catalog.' || fn ORDER BY fn) FROM f), '{}'),
  coalesce((SELECT array_agg('pg_catalog.' || fn ORDER BY fn) FROM f WHERE has_function_privilege('public', f.oid, 'EXECUTE')), '{}'),
  coalesce((SELECT array_agg(DISTINCT r.rolname::text) FROM pg_roles r, f
    WHERE r.rolcanlogin AND NOT r.rolsuper AND r.rolname <> current_user
      AND has_function_privilege(r.oid, f.oid, 'EXECUTE')
      AND NOT has_table_privilege(r.oid, $1::regclass, 'INSERT')), '{}')`

// CheckMessages fails with ErrMessagesOpen, saying what to run, unless
// only superusers, this session's role and roles that may insert into the
// outbox table can execute pg_logical_emit_message: the producers'
// privilege (INSERT on the outbox) is what it takes to write an event,
// whichever the mode. Run checks it when Config.Messages is on.
func CheckMessages(ctx context.Context, db Querier, t outbox.Tables) error {
	var funcs, public, roles []string
	if err := db.QueryRow(ctx, emitMessageACLSQL, t.OutboxIdent()).Scan(&funcs, &public, &roles); err != nil {
		return fmt.Errorf("walrelay: read who may execute pg_logical_emit_message: %w", err)
	}
	if len(public) > 0 {
		return fmt.Errorf("%w: message-mode events are on (--messages, Config.Messages), but PUBLIC can execute %s, so any role could write events of %s; as a superuser run: REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC; GRANT EXECUTE ON FUNCTION %s TO <the producers' role>, <the relay's role, for its heartbeats>; ('outbox relay --mode wal --setup-only --messages' does the REVOKE), or leave message-mode events off",
			ErrMessagesOpen, strings.Join(public, ", "), t.OutboxIdent(), strings.Join(public, ", "), strings.Join(funcs, ", "))
	}
	if len(roles) > 0 {
		for i, n := range roles {
			roles[i] = pgident.Quote(n)
		}
		return fmt.Errorf("%w: message-mode events are on (--messages, Config.Messages), but role(s) %s can execute pg_logical_emit_message and may not insert into %s, so they could write its events without being its producers; as a superuser run: REVOKE EXECUTE ON FUNCTION %s FROM %s; or, if they are its producers, GRANT INSERT ON %s TO %s",
			ErrMessagesOpen, strings.Join(roles, ", "), t.OutboxIdent(), strings.Join(funcs, ", "), strings.Join(roles, ", "), t.OutboxIdent(), strings.Join(roles, ", "))
	}
	return nil
}

// SecureMessages revokes EXECUTE on every overload of
// pg_logical_emit_message from PUBLIC in db's database (function
// privileges are per database), which Config.Messages requires, and
// returns the statements it ran. It needs a superuser (or the functions'
// owner): otherwise it fails with the statements to run as one. The
// producers' role, and the relay's (for its heartbeats) if it is not a
// superuser, then need EXECUTE granted back (GrantMessagesSQL).
func SecureMessages(ctx context.Context, db Querier) ([]string, error) {
	stmts, err := revokeMessagesSQL(ctx, db)
	if err != nil {
		return nil, err
	}
	for i, s := range stmts {
		if _, err := db.Exec(ctx, s); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
				return stmts[:i], fmt.Errorf("walrelay: revoke pg_logical_emit_message from PUBLIC (it takes a superuser): %w; as a superuser run: %s", err, strings.Join(stmts, " "))
			}
			return stmts[:i], fmt.Errorf("walrelay: %s: %w", s, err)
		}
	}
	return stmts, nil
}

// GrantMessagesSQL is the statement that lets role write logical messages
// once SecureMessages has revoked them from PUBLIC.
func GrantMessagesSQL(ctx context.Context, db Querier, role string) (string, error) {
	funcs, err := emitMessageFuncs(ctx, db)
	if err != nil {
		return "", err
	}
	return "GRANT EXECUTE ON FUNCTION " + strings.Join(funcs, ", ") + " TO " + role + ";", nil
}

func revokeMessagesSQL(ctx context.Context, db Querier) ([]string, error) {
	funcs, err := emitMessageFuncs(ctx, db)
	if err != nil {
		return nil, err
	}
	stmts := make([]string, len(funcs))
	for i, fn := range funcs {
		stmts[i] = "REVOKE EXECUTE ON FUNCTION " + fn + " FROM PUBLIC;"
	}
	return stmts, nil
}

// emitMessageFuncsSQL lists pg_logical_emit_message's overloads.
const emitMessageFuncsSQL = `SELECT coalesce(array_agg('pg_catalog.' || p.oid::regprocedure::text ORDER BY p.oid::regprocedure::text), '{}')
FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message' AND p.pronamespace = 'pg_catalog'::regnamespace`

func emitMessageFuncs(ctx context.Context, db Querier) ([]string, error) {
	var funcs []string
	if err := db.QueryRow(ctx, emitMessageFuncsSQL).Scan(&funcs); err != nil {
		return nil, fmt.Errorf("walrelay: list pg_logical_emit_message's overloads: %w", err)
	}
	return funcs, nil
}
