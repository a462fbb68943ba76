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
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		if len(log) > 2000 {
			log = log[len(log)-2000:]
		}
		return fmt.Errorf("tmppg: pg_ctl start: %w: %s\nserver log (end):\n%s", err, out, log)
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

// Kill crashes the server with SIGKILL, the postmaster and every process
// it started at once (as the kernel's OOM killer or a power cut would end
// them: no shutdown checkpoint, no goodbye to clients), and waits until
// they are gone. Up starts it again, through crash recovery.
func (c *Cluster) Kill() error {
	raw, err := os.ReadFile(filepath.Join(c.dir, "data", "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("tmppg: kill: no running server: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0]))
	if err != nil {
		return fmt.Errorf("tmppg: kill: postmaster.pid: %w", err)
	}
	pids := append(childrenOf(pid), pid)
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range pids {
		for syscall.Kill(p, 0) == nil && !zombie(p) {
			if time.Now().After(deadline) {
				return fmt.Errorf("tmppg: kill: process %d still runs", p)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// A killed postmaster whose parent does not reap it (as in containers
	// whose first process reaps nothing) stays a zombie, whose pid still
	// answers: the next start would take its lock file for a running
	// server's. Its processes are gone, so the lock file is stale.
	// The same holds for the socket's lock file.
	stale, _ := filepath.Glob(filepath.Join(c.dir, ".s.PGSQL.*"))
	for _, f := range append(stale, filepath.Join(c.dir, "data", "postmaster.pid")) {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("tmppg: kill: remove the stale %s: %w", f, err)
		}
	}
	return nil
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(child); ok && ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

// parentOf reads a process's parent from /proc/<pid>/stat (field 4, after
// the command in parentheses, which may hold spaces).
func parentOf(pid int) (int, bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	i := strings.LastIndexByte(string(stat), ')')
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(fields[1])
	return ppid, err == nil
}

// zombie reports whether pid has exited and waits to be reaped.
func zombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] == 'Z'
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
