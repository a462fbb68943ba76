package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// connectError says once why Postgres did not take the connection, and
// what fits that cause: pgx's own error names the server once per address
// and TLS mode it tried, and one hint ("is it running?") cannot fit a
// missing database, role or password.
func connectError(err error, c *pgconn.Config) error {
	where := fmt.Sprintf("%s:%d/%s as %s", c.Host, c.Port, c.Database, c.User)
	cause, hint := connectCause(lastAttempt(err), c)
	return fmt.Errorf("cannot reach Postgres at %s: %s; %s", where, cause, hint)
}

// connectCause is the cause of a failed connection in a few words, and
// what to do about it.
func connectCause(err error, c *pgconn.Config) (cause, hint string) {
	const setURL = "--database-url or DATABASE_URL"
	hostPort := net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		cause = pgErr.Message
		switch pgErr.Code {
		case "3D000": // invalid_catalog_name
			return cause, fmt.Sprintf("create it (createdb %s%s), or name an existing database in %s",
				libpqArgs(c, true), quoteArg(c.Database), setURL)
		case "28P01": // invalid_password
			return cause, fmt.Sprintf("check the password of user %s in %s (or PGPASSWORD, ~/.pgpass)", c.User, setURL)
		case "28000": // invalid_authorization_specification: no such role, or no pg_hba.conf entry
			if strings.HasPrefix(cause, "role ") {
				return cause, fmt.Sprintf("create the role (createuser %s%s, or CREATE ROLE %s LOGIN), or check the user in %s",
					libpqArgs(c, false), quoteArg(c.User), quoteArg(c.User), setURL)
			}
			if strings.Contains(cause, "no encryption") {
				return cause, fmt.Sprintf("the server accepts this user only over TLS: add sslmode=require (or verify-full) to %s", setURL)
			}
			return cause, fmt.Sprintf("the server's pg_hba.conf does not let user %s in from here: check the user and host in %s, or ask the server's administrator", c.User, setURL)
		case "53300": // too_many_connections
			return cause, "the server has no free connection slot: try again, raise max_connections, or put a pooler in front"
		case "57P03": // cannot_connect_now: starting up, shutting down, in recovery
			return cause, "try again in a moment"
		}
		return cause + " (SQLSTATE " + pgErr.Code + ")", "set " + setURL
	}
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused", fmt.Sprintf("is Postgres running at %s? start it, or set %s", hostPort, setURL)
	case strings.HasPrefix(c.Host, "/") && errors.Is(err, os.ErrNotExist):
		return fmt.Sprintf("no server socket in %s", c.Host), fmt.Sprintf("is Postgres running on this machine (port %d)? start it, or set the host in %s", c.Port, setURL)
	case errors.As(err, &dnsErr):
		return fmt.Sprintf("host %q not found", dnsErr.Name), "check the host in " + setURL
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return "no answer in time", fmt.Sprintf("is %s the server, and reachable from here (firewall)? set %s, or connect_timeout=N in it", hostPort, setURL)
	case errors.As(err, &hostErr):
		return "the server's TLS certificate does not name " + c.Host + " (" + innermost(err) + ")",
			"connect by a name the certificate holds, or use sslmode=verify-ca (checks the CA, not the name) in " + setURL
	case errors.As(err, &certErr) || errors.As(err, &unknownCA):
		return "the server's TLS certificate was not accepted (" + innermost(err) + ")",
			"give its CA with sslrootcert=FILE in " + setURL + ", or use sslmode=require to encrypt without verifying"
	case strings.Contains(err.Error(), "server refused TLS connection"):
		return "the server does not offer TLS", "use sslmode=disable or prefer in " + setURL + ", or turn ssl on in the server"
	}
	return innermost(err), fmt.Sprintf("is %s a Postgres server? set %s", hostPort, setURL)
}

// lastAttempt is the error of pgx's last connection attempt. With
// sslmode=prefer (the default) pgx tries TLS, then plain: the first
// error is often "server refused TLS connection", which is no fault, and
// the second says what went wrong.
func lastAttempt(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return err
	}
	if j, ok := ce.Unwrap().(interface{ Unwrap() []error }); ok {
		if errs := j.Unwrap(); len(errs) > 0 {
			return errs[len(errs)-1]
		}
	}
	return ce.Unwrap()
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// innermost is the first innermost error of err's tree: the cause
// without the "failed to connect to ..." prefixes, said once even when
// several attempts failed the same way.
func innermost(err error) string {
	for {
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			if errs := u.Unwrap(); len(errs) > 0 {
				err = errs[0]
				continue
			}
		case interface{ Unwrap() error }:
			if next := u.Unwrap(); next != nil {
				err = next
				continue
			}
		}
		return redactErr(err)
	}
}

// libpqArgs are the -h, -p and (withUser) -U options that make createdb
// or createuser reach the same server as the failed connection.
func libpqArgs(c *pgconn.Config, withUser bool) string {
	var b strings.Builder
	if c.Host != "" {
		b.WriteString("-h " + quoteArg(c.Host) + " ")
	}
	if c.Port != 0 && c.Port != 5432 {
		b.WriteString("-p " + strconv.Itoa(int(c.Port)) + " ")
	}
	if withUser && c.User != "" {
		b.WriteString("-U " + quoteArg(c.User) + " ")
	}
	return b.String()
}

// quoteArg quotes s for a POSIX shell when it needs it.
func quoteArg(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
