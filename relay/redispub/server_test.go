package redispub_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// privateServer is a redis-server of a test's own, on a free port, with
// its append-only file in a directory of the test's, so that it can be
// killed, restarted and reconfigured.
type privateServer struct {
	t    *testing.T
	port int
	dir  string
	cmd  *exec.Cmd
}

// startPrivate starts a private redis-server, skipping the test when the
// binary is missing (failing it under CI).
func startPrivate(t *testing.T) *privateServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed; .ci/run installs it")
		}
		t.Skip("redis-server is not installed (apt-get install redis-server)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &privateServer{t: t, port: port, dir: t.TempDir()}
	s.start()
	t.Cleanup(s.kill)
	return s
}

func (s *privateServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// start runs the server and waits until it answers.
func (s *privateServer) start() {
	s.t.Helper()
	s.cmd = exec.Command("redis-server", "--port", fmt.Sprint(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir", s.dir)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server on port %d did not answer within 20s", s.port)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill stops the server with SIGKILL, as a crash does.
func (s *privateServer) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// client returns a client of the server, closed when the test ends.
func (s *privateServer) client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// clientOf returns a client of addr that does not retry, closed when the
// test ends.
func clientOf(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}
