package walrelay

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

// ErrMessagesOpen: Config.Messages is on, but roles other than the
// trusted ones can write logical messages (pg_logical_emit_message is
// executable by PUBLIC, as Postgres ships it, or by another role), so they
// could write the outbox's events and choose their ids.
var ErrMessagesOpen = errors.New("walrelay: roles other than the outbox's own can write its event messages")

// emitMessageACLSQL reads, of pg_logical_emit_message's overloads (two
// on PG 15, text and bytea content; PG 17 adds a flush argument): all of
// them, those PUBLIC can execute, the roles (every role, login or not)
// that can execute one and are not trusted to, and the owner of the
// outbox's <outbox>_emit_message(uuid, text, jsonb, jsonb) ($1; NULL if it
// does not exist). Trusted are superusers, this session's role (the
// relay's: it writes heartbeats), that owner, and their members, who can
// SET ROLE to them anyway. A NOINHERIT member of a role that can execute
// it is not listed itself, but that role is. pg_roles is small: this is
// cheap.
const emitMessageACLSQL = `WITH f AS (
  SELECT p.oid, p.oid::regprocedure::text AS fn FROM pg_proc p
  WHERE p.proname = 'pg_logical_emit_message' AND p.pronamespace = 'pg_catalog'::regnamespace
), owner AS (
  SELECT p.proowner FROM pg_proc p WHERE p.oid = to_regprocedure($1::text)
), trusted AS (
  SELECT r.oid FROM pg_roles r
  WHERE r.rolsuper OR r.rolname = current_user OR r.oid = (SELECT proowner FROM owner)
)
SELECT coalesce((SELECT array_agg('pg_catalog.' || fn ORDER BY fn) FROM f), '{}'),
  coalesce((SELECT array_agg('pg_catalog.' || fn ORDER BY fn) FROM f WHERE has_function_privilege('public', f.oid, 'EXECUTE')), '{}'),
  coalesce((SELECT array_agg(DISTINCT r.rolname::text) FROM pg_roles r, f
    WHERE has_function_privilege(r.oid, f.oid, 'EXECUTE')
      AND NOT EXISTS (SELECT 1 FROM trusted WHERE pg_has_role(r.oid, trusted.oid, 'MEMBER'))), '{}'),
  (SELECT proowner::regrole::text FROM owner), current_user::regrole::text`

// CheckMessages fails with ErrMessagesOpen, saying what to run, unless
// only superusers, this session's role (the relay's, for its heartbeats),
// the owner of the outbox's <outbox>_emit_message function (migration 7)
// and their members can execute pg_logical_emit_message. Producers call
// that function, which draws each event's id from the outbox's sequence:
// a role that could write the message itself could choose the id, and
// consumers would skip the real event with it as a duplicate. It fails
// too when the function does not exist. Run checks it when Config.Messages
// is on.
func CheckMessages(ctx context.Context, db outbox.DB, t outbox.Tables) error {
	fn := EmitMessageFunc(t)
	var funcs, public, roles []string
	var owner *string
	var self string
	if err := db.QueryRow(ctx, emitMessageACLSQL, fn).Scan(&funcs, &public, &roles, &owner, &self); err != nil {
		return fmt.Errorf("walrelay: read who may execute pg_logical_emit_message: %w", err)
	}
	if owner == nil {
		return fmt.Errorf("%w: message-mode events are on (--messages, Config.Messages), but %s does not exist, through which producers write them; run 'outbox migrate up' (migration 7)", ErrMessagesOpen, fn)
	}
	grant := "GRANT EXECUTE ON FUNCTION " + fn + " TO "
	if len(public) > 0 {
		return fmt.Errorf("%w: message-mode events are on (--messages, Config.Messages), but PUBLIC can execute %s, so any role could write events of %s and choose their ids; as a superuser, in this database, run: REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC; ('outbox relay --mode wal --setup-only --messages' does it) and %s<the producers' role>; or leave message-mode events off",
			ErrMessagesOpen, strings.Join(public, ", "), t.OutboxIdent(), strings.Join(public, ", "), grant)
	}
	if len(roles) > 0 {
		for i, n := range roles {
			roles[i] = pgident.Quote(n)
		}
		list := strings.Join(roles, ", ")
		return fmt.Errorf("%w: message-mode events are on (--messages, Config.Messages), but role(s) %s can execute pg_logical_emit_message, so they could write events of %s and choose their ids (only superusers, the relay's role %s and %s, the owner of %s, may); as a superuser, in this database, run: REVOKE EXECUTE ON FUNCTION %s FROM %s; and, for those that produce events, %s%s; (a role that has it through membership of another keeps it until that role's is revoked)",
			ErrMessagesOpen, list, t.OutboxIdent(), self, *owner, fn, strings.Join(funcs, ", "), list, grant, list)
	}
	return nil
}

// EmitMessageFunc is the function through which producers write the
// message-mode events of the outbox t (migration 7), with its argument
// types, as GRANT and REVOKE name it: "<schema>.<outbox>_emit_message(uuid,
// text, jsonb, jsonb)". Producers need EXECUTE on it, and nothing else.
func EmitMessageFunc(t outbox.Tables) string {
	t = t.WithDefaults()
	return sqltext.For(t.Schema, t.Outbox, t.Processed).EmitMessageFn + "(uuid, text, jsonb, jsonb)"
}

// SecureMessages revokes EXECUTE on every overload of
// pg_logical_emit_message from PUBLIC in db's database (function
// privileges are per database: run it in each database with an outbox
// whose relay takes message-mode events), which Config.Messages requires,
// and returns the statements it ran. It needs a superuser (or the
// functions' owner): otherwise it fails with the statements to run as one.
// The relay's role (for its heartbeats) and the owner of
// <outbox>_emit_message, if they are not superusers, then need EXECUTE
// granted back (GrantMessagesSQL); producers need only EXECUTE on
// EmitMessageFunc.
func SecureMessages(ctx context.Context, db outbox.DB) ([]string, error) {
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
// once SecureMessages has revoked them from PUBLIC: for the relay's role
// and the owner of <outbox>_emit_message only (CheckMessages refuses any
// other); producers are granted EmitMessageFunc instead.
func GrantMessagesSQL(ctx context.Context, db outbox.DB, role string) (string, error) {
	funcs, err := emitMessageFuncs(ctx, db)
	if err != nil {
		return "", err
	}
	return "GRANT EXECUTE ON FUNCTION " + strings.Join(funcs, ", ") + " TO " + role + ";", nil
}

func revokeMessagesSQL(ctx context.Context, db outbox.DB) ([]string, error) {
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

func emitMessageFuncs(ctx context.Context, db outbox.DB) ([]string, error) {
	var funcs []string
	if err := db.QueryRow(ctx, emitMessageFuncsSQL).Scan(&funcs); err != nil {
		return nil, fmt.Errorf("walrelay: list pg_logical_emit_message's overloads: %w", err)
	}
	return funcs, nil
}
