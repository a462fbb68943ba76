// Package tmppg starts a throwaway Postgres cluster in a temporary directory,
// for `outbox demo` on a machine where no server answers, and for tests that
// need server settings the machine's server lacks (StartWith, Logical: the
// WAL relay's wal_level=logical). It needs initdb and
// pg_ctl on the PATH. Postgres refuses to run as root, so when started by
// root the cluster runs as the "postgres" user (or $OUTBOX_PG_USER).
package tmppg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Cluster is a running throwaway cluster.
type Cluster struct {
	dir    string
	pgctl  string
	cred   *syscall.Credential
	port   int
	dbUser string
	opts   string // the server options pg_ctl start was given
}

// Available reports whether initdb and pg_ctl are on the PATH.
func Available() bool {
	_, err1 := exec.LookPath("initdb")
	_, err2 := exec.LookPath("pg_ctl")
	return err1 == nil && err2 == nil
}

// Options tunes StartWith.
type Options struct {
	// Settings are server settings passed as -c name=value at start, e.g.
	// {"wal_level": "logical", "max_replication_slots": "20"} for a cluster
	// that can decode its WAL. They come after the defaults (fsync=off,
	// max_connections=60), so they can override them. Defaults to none.
	Settings map[string]string
}

// Start creates and starts a cluster listening on 127.0.0.1 on a free port.
func Start(ctx context.Context) (*Cluster, error) {
	return StartWith(ctx, Options{})
}

// StartWith is Start with server settings.
func StartWith(ctx context.Context, o Options) (*Cluster, error) {
	initdb, err := exec.LookPath("initdb")
	if err != nil {
		return nil, errors.New("tmppg: initdb is not on the PATH; install PostgreSQL server binaries or set DATABASE_URL")
	}
	pgctl, err := exec.LookPath("pg_ctl")
	if err != nil {
		return nil, errors.New("tmppg: pg_ctl is not on the PATH; install PostgreSQL server binaries or set DATABASE_URL")
	}
	c := &Cluster{pgctl: pgctl}
	var owner *user.User
	if os.Geteuid() == 0 {
		name := os.Getenv("OUTBOX_PG_USER")
		if name == "" {
			name = "postgres"
		}
		owner, err = user.Lookup(name)
		if err != nil {
			return nil, fmt.Errorf("tmppg: running as root, and Postgres will not; no user %q to run it as (set OUTBOX_PG_USER): %w", name, err)
		}
		uid, _ := strconv.Atoi(owner.Uid)
		gid, _ := strconv.Atoi(owner.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		c.dbUser = owner.Username
	} else {
		u, err := user.Current()
		if err != nil {
			return nil, err
		}
		c.dbUser = u.Username
	}
	c.dir, err = os.MkdirTemp("", "outbox-pg-")
	if err != nil {
		return nil, err
	}
	if c.cred != nil {
		if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			c.cleanup()
			return nil, err
		}
	}
	c.port, err = freePort()
	if err != nil {
		c.cleanup()
		return nil, err
	}
	data := filepath.Join(c.dir, "data")
	if out, err := c.run(ctx, initdb, "-D", data, "-A", "trust", "-U", c.dbUser, "--no-sync", "-E", "UTF8"); err != nil {
		c.cleanup()
		return nil, fmt.Errorf("tmppg: initdb: %w: %s", err, out)
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60", c.port, c.dir)
	names := make([]string, 0, len(o.Settings))
	for k := range o.Settings {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		v := o.Settings[k]
		if !settingRE.MatchString(k) || strings.ContainsAny(v, " '\"\\") {
			c.cleanup()
			return nil, fmt.Errorf("tmppg: setting %s=%q: use a plain name and a value without spaces or quotes", k, v)
		}
		opts += fmt.Sprintf(" -c %s=%s", k, v)
	}
	c.opts = opts
	if err := c.start(ctx); err != nil {
		c.cleanup()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	if out, err := c.run(ctx, c.pgctl, "-D", filepath.Join(c.dir, "data"), "-o", c.opts, "-l", filepath.Join(c.dir, "log"), "-w", "-t", "30", "start"); err != nil {
		return fmt.Errorf("tmppg: pg_ctl start: %w: %s", err, out)
	}
	return nil
}

// Restart stops the server as a crash would (pg_ctl stop -m immediate:
// every session ends at once, nothing is checkpointed), keeps it down for
// down, and starts it again on the same port and data, for tests of
// outages. It returns once the server accepts connections.
func (c *Cluster) Restart(ctx context.Context, down time.Duration) error {
	if err := c.Down(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(down):
	}
	return c.Up(ctx)
}

// Down stops the server as a crash would, keeping its data: Up starts it
// again on the same port.
func (c *Cluster) Down(ctx context.Context) error {
	if out, err := c.run(ctx, c.pgctl, "-D", filepath.Join(c.dir, "data"), "-m", "immediate", "-w", "stop"); err != nil {
		return fmt.Errorf("tmppg: pg_ctl stop: %w: %s", err, out)
	}
	return nil
}

// Up starts the server that Down stopped. It returns once the server
// accepts connections.
func (c *Cluster) Up(ctx context.Context) error { return c.start(ctx) }

// URL connects to the cluster's postgres database.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", c.dbUser, c.port)
}

// Stop stops the cluster and removes its directory.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := c.run(ctx, c.pgctl, "-D", filepath.Join(c.dir, "data"), "-m", "fast", "-w", "stop")
	c.cleanup()
	if err != nil {
		return fmt.Errorf("tmppg: pg_ctl stop: %w: %s", err, out)
	}
	return nil
}

func (c *Cluster) cleanup() { _ = os.RemoveAll(c.dir) }

func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.dir
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd.CombinedOutput()
}

var settingRE = regexp.MustCompile(`^[a-z_][a-z0-9_.]*$`)

// Logical starts a cluster that can decode its WAL (wal_level=logical),
// with room for slots replicas of relayers in tests: the settings the WAL
// relay needs, plus extra.
func Logical(ctx context.Context, slots int, extra map[string]string) (*Cluster, error) {
	s := map[string]string{
		"wal_level":             "logical",
		"max_replication_slots": strconv.Itoa(slots),
		"max_wal_senders":       strconv.Itoa(slots),
	}
	for k, v := range extra {
		s[k] = v
	}
	return StartWith(ctx, Options{Settings: s})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
