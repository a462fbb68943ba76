// Package natstest starts private nats-server instances with JetStream for
// tests that must kill, restart or reconfigure their server, and reads
// streams back.
package natstest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// Binary is the nats-server the tests start.
const Binary = "/usr/sbin/nats-server"

// Server is a private nats-server with JetStream.
type Server struct {
	t    *testing.T
	Port int
	Dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a private nats-server on a free port with a store
// directory of its own, killed when t ends. It skips t when the binary is
// missing (fails it when CI=true).
func Start(t *testing.T) *Server {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("natstest: %s is missing; install nats-server", Binary)
		}
		t.Skipf("natstest: %s is missing; install nats-server to run this test", Binary)
	}
	s := &Server{t: t, Port: freePort(t), Dir: t.TempDir()}
	s.Restart()
	t.Cleanup(s.Kill)
	return s
}

// URL is the server's client URL.
func (s *Server) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(s.Port) }

// Restart starts the server (again) on its port and store, and waits
// until JetStream answers.
func (s *Server) Restart() {
	s.t.Helper()
	cmd := exec.Command(Binary, "-a", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-js", "-sd", filepath.Join(s.Dir, "store"))
	cmd.Stdout, cmd.Stderr = nil, nil
	require.NoError(s.t, cmd.Start())
	done := make(chan struct{})
	s.cmd, s.done = cmd, done
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.ping()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("natstest: nats-server on port %d not ready after 30s: %v", s.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) ping() error {
	nc, err := nats.Connect(s.URL(), nats.NoReconnect(), nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// Kill kills the server with SIGKILL (no clean shutdown).
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// Connect returns a connection to url, closed when t ends.
func Connect(t *testing.T, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return nc, js
}

// AddStream creates a stream named name capturing subjects.
func AddStream(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, cfg)
	require.NoError(t, err, "create stream %s", cfg.Name)
	return s
}

// Msg is one stored message.
type Msg struct {
	Seq     uint64
	Subject string
	Header  nats.Header
	Data    []byte
}

// ReadStream returns every message stream holds on subject ("" for all),
// in stream order, read with an ordered consumer.
func ReadStream(t *testing.T, js jetstream.JetStream, stream, subject string) []Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	var occ jetstream.OrderedConsumerConfig
	if subject != "" {
		occ.FilterSubjects = []string{subject}
	}
	cons, err := s.OrderedConsumer(ctx, occ)
	require.NoError(t, err)
	var out []Msg
	for {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(500*time.Millisecond))
		require.NoError(t, err)
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			require.NoError(t, err)
			out = append(out, Msg{Seq: md.Sequence.Stream, Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
			if md.Sequence.Stream >= last {
				return out
			}
		}
		if n == 0 { // nothing more on subject up to the last sequence
			return out
		}
		require.NoError(t, ctx.Err(), "reading stream %s", stream)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// String names the server in messages.
func (s *Server) String() string { return fmt.Sprintf("nats-server :%d", s.Port) }
