package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// pg_recvlogical is the baseline of the WAL source: Postgres's own client
// reading the same slot with the same pgoutput options, writing what it
// gets to /dev/null. What it costs the server (decoding, sending) is the
// least any reader of the slot costs; what it reaches is the most a
// reader can.

// findRecvlogical looks for pg_recvlogical on the PATH, then next to
// initdb (Debian keeps the server's tools in /usr/lib/postgresql/N/bin),
// and says where it looked when it is in neither.
func findRecvlogical() (string, error) {
	if p, err := exec.LookPath("pg_recvlogical"); err == nil {
		return p, nil
	}
	initdb, err := exec.LookPath("initdb")
	if err != nil {
		return "", errors.New("pg_recvlogical is not on the PATH, and neither is initdb to look beside (install the PostgreSQL client tools, or put their directory on the PATH)")
	}
	if real, err := filepath.EvalSymlinks(initdb); err == nil {
		initdb = real
	}
	p := filepath.Join(filepath.Dir(initdb), "pg_recvlogical")
	if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("pg_recvlogical is not on the PATH nor next to initdb (%s)", filepath.Dir(initdb))
	}
	return p, nil
}

// recvlogicalArgs are the options of a pg_recvlogical that reads slot as
// the WAL relayer does: pgoutput protocol 1, the outbox's publication,
// logical messages included, a status update every second (the relayer's
// StatusInterval); endpos, if set, ends it there.
func recvlogicalArgs(slot, publication, endpos string) []string {
	args := []string{"--slot", slot, "--start", "--no-loop",
		"-o", "proto_version=1", "-o", "publication_names=" + publication, "-o", "messages=true",
		"--status-interval", "1", "-f", "/dev/null"}
	if endpos != "" {
		args = append(args, "--endpos", endpos)
	}
	return args
}

// recvlogicalConn turns a database URL into pg_recvlogical's -d and the
// environment that carries the password, so it shows in no process list.
func recvlogicalConn(dbURL string) (dsn string, env []string) {
	u, err := url.Parse(dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.User == nil {
		return dbURL, nil // a keyword=value string, or no password: as given
	}
	if pw, ok := u.User.Password(); ok {
		env = append(env, "PGPASSWORD="+pw)
		u.User = url.User(u.User.Username())
	}
	return u.String(), env
}

// recvlogical is a running pg_recvlogical.
type recvlogical struct {
	cmd    *exec.Cmd
	start  time.Time
	exited chan struct{}
	err    error // set when exited closes
	at     time.Time
	stderr *tailBuffer
}

// startRecvlogical runs pg_recvlogical (at path) on slot of the server at
// dbURL.
func startRecvlogical(ctx context.Context, path, dbURL, slot, publication, endpos string) (*recvlogical, error) {
	dsn, env := recvlogicalConn(dbURL)
	cmd := exec.CommandContext(ctx, path, append([]string{"-d", dsn}, recvlogicalArgs(slot, publication, endpos)...)...)
	cmd.Env = append(os.Environ(), env...)
	r := &recvlogical{cmd: cmd, exited: make(chan struct{}), stderr: &tailBuffer{max: 4096}}
	cmd.Stderr = r.stderr
	r.start = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start pg_recvlogical: %w", err)
	}
	go func() {
		r.err = cmd.Wait()
		r.at = time.Now()
		close(r.exited)
	}()
	return r, nil
}

// wait waits for pg_recvlogical to exit by itself (at --endpos) and
// returns its run time, from start to exit.
func (r *recvlogical) wait(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	select {
	case <-r.exited:
	case <-ctx.Done():
		r.kill()
		return 0, ctx.Err()
	case <-time.After(timeout):
		r.kill()
		return 0, fmt.Errorf("pg_recvlogical did not reach its end position within %s: %s", timeout, r.stderr)
	}
	if r.err != nil {
		return 0, fmt.Errorf("pg_recvlogical: %v: %s", r.err, r.stderr)
	}
	return r.at.Sub(r.start), nil
}

// running fails if pg_recvlogical has exited.
func (r *recvlogical) running() error {
	select {
	case <-r.exited:
		return fmt.Errorf("pg_recvlogical exited: %v: %s", r.err, r.stderr)
	default:
		return nil
	}
}

// stop ends pg_recvlogical as a person would (SIGINT: it sends a last
// status update and exits 0).
func (r *recvlogical) stop() error {
	if err := r.running(); err != nil {
		return err
	}
	_ = r.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-r.exited:
		return nil // SIGINT is its normal way out, whatever the status
	case <-time.After(10 * time.Second):
		r.kill()
		return errors.New("pg_recvlogical did not exit within 10s of SIGINT")
	}
}

func (r *recvlogical) kill() {
	select {
	case <-r.exited:
	default:
		_ = r.cmd.Process.Kill()
		<-r.exited
	}
}

// tailBuffer keeps the last max bytes written to it: a child's stderr,
// for the error that says why it stopped.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b.Write(p)
	if over := t.b.Len() - t.max; over > 0 {
		t.b.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(t.b.String())
}
