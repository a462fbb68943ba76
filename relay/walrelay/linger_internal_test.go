package walrelay

import (
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// lingerPair is a TCP connection whose reading end lingers.
func lingerPair(t *testing.T, linger time.Duration) (r *lingerConn, w net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	w = <-accepted
	require.NotNil(t, w)
	t.Cleanup(func() { c.Close(); w.Close() })
	return newLingerConn(c, linger), w
}

func write(t *testing.T, w net.Conn, s string) {
	t.Helper()
	_, err := w.Write([]byte(s))
	require.NoError(t, err)
}

// Once a read took in everything there was, what the server writes
// within the linger comes in with the next read, in one piece.
func TestLingerTakesInWhatArrivesMeanwhileInOneRead(t *testing.T) {
	t.Parallel()
	const linger = 300 * time.Millisecond
	r, w := lingerPair(t, linger)
	clk := newFakeClock()
	r.clock = clk
	buf := make([]byte, 64)
	write(t, w, "a")
	n, err := r.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "a", string(buf[:n]))
	r.mu.Lock()
	drained := r.drained
	r.mu.Unlock()
	require.False(t, drained.IsZero(), "a short read drains")
	got := readAsync(r, buf)
	clk.waitArmed(t, linger) // the read waits out the linger
	for _, s := range []string{"b", "c", "d"} {
		write(t, w, s)
	}
	require.Empty(t, got, "the read returned before the linger passed")
	clk.Advance(linger)
	res := wait(t, got)
	require.NoError(t, res.err)
	require.Equal(t, "bcd", res.data, "three writes, one read")
}

type readResult struct {
	data string
	err  error
}

// readAsync reads once from r into buf, in a goroutine of its own.
func readAsync(r *lingerConn, buf []byte) chan readResult {
	got := make(chan readResult, 1)
	go func() {
		n, err := r.Read(buf)
		got <- readResult{string(buf[:n]), err}
	}()
	return got
}

func wait(t *testing.T, got chan readResult) readResult {
	t.Helper()
	select {
	case res := <-got:
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("the read did not return")
		return readResult{}
	}
}

// The first message after a quiet spell is read as it comes, and a read
// that filled the buffer, or any read while the stream is behind, is
// followed at once.
func TestLingerDoesNotDelayAQuietStreamOrOneBehind(t *testing.T) {
	t.Parallel()
	const linger = 5 * time.Second // any wait would show
	r, w := lingerPair(t, linger)
	buf := make([]byte, 4)

	start := time.Now()
	write(t, w, "0123456789")
	for _, want := range []string{"0123", "4567", "89"} {
		n, err := r.Read(buf)
		require.NoError(t, err)
		require.Equal(t, want, string(buf[:n]))
	}
	require.Less(t, time.Since(start), linger/2, "full reads are followed at once")

	// The last read drained the socket: once the linger has passed
	// since, the next read does not wait.
	r.mu.Lock()
	r.drained = time.Now().Add(-linger)
	r.mu.Unlock()
	start = time.Now()
	write(t, w, "x")
	n, err := r.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "x", string(buf[:n]))
	require.Less(t, time.Since(start), linger/2, "a read after a quiet spell does not wait")

	// Right after a short read, a stream that is behind reads at once.
	r.behind.Store(true)
	start = time.Now()
	write(t, w, "y")
	n, err = r.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "y", string(buf[:n]))
	require.Less(t, time.Since(start), linger/2, "a stream behind does not wait")
	r.behind.Store(false)

	// A short read that brought lingerBelow bytes or more (a busy stream,
	// a message larger than the socket's buffers) is followed at once.
	big := make([]byte, 2*lingerBelow)
	r.mu.Lock()
	r.drained = time.Time{} // after a quiet spell
	r.mu.Unlock()
	write(t, w, strings.Repeat("z", lingerBelow))
	n, err = io.ReadAtLeast(r, big, lingerBelow)
	require.NoError(t, err)
	require.Equal(t, lingerBelow, n)
	r.mu.Lock()
	require.True(t, r.drained.IsZero(), "no wait after %d bytes", n)
	r.mu.Unlock()
	start = time.Now()
	write(t, w, "q")
	n, err = r.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "q", string(buf[:n]))
	require.Less(t, time.Since(start), linger/2, "a read after a big one does not wait")
}

// A deadline ends the wait: one already set bounds it, one set during it
// (the stream's round ending, a settled batch, a cancelled context) ends
// it at once; either way the read then times out as the deadline says.
func TestLingerHonoursDeadlines(t *testing.T) {
	t.Parallel()
	const linger = 10 * time.Second
	r, w := lingerPair(t, linger)
	clk := newFakeClock()
	r.clock = clk
	buf := make([]byte, 64)
	write(t, w, "a")
	_, err := r.Read(buf)
	require.NoError(t, err)

	require.NoError(t, r.SetReadDeadline(clk.Now().Add(50*time.Millisecond)))
	got := readAsync(r, buf)
	clk.waitArmed(t, 50*time.Millisecond) // the deadline bounds the wait
	clk.Advance(50 * time.Millisecond)
	res := wait(t, got)
	require.True(t, errors.Is(res.err, os.ErrDeadlineExceeded), "%v", res.err)

	require.NoError(t, r.SetReadDeadline(time.Time{}))
	got = readAsync(r, buf)
	clk.waitArmed(t, linger-50*time.Millisecond)
	require.NoError(t, r.SetDeadline(time.Unix(1, 0))) // as pgconn's deadline handler cancels
	res = wait(t, got)
	require.True(t, errors.Is(res.err, os.ErrDeadlineExceeded), "%v", res.err)

	// A deadline set during the wait, sooner than its end, ends it then.
	require.NoError(t, r.SetReadDeadline(time.Time{}))
	r.mu.Lock()
	r.drained = clk.Now()
	r.mu.Unlock()
	got = readAsync(r, buf)
	clk.waitArmed(t, linger)
	require.NoError(t, r.SetReadDeadline(clk.Now().Add(50*time.Millisecond)))
	clk.waitArmed(t, 50*time.Millisecond) // the new deadline bounds the wait
	require.Empty(t, got, "the read returned before its deadline")
	clk.Advance(50 * time.Millisecond)
	res = wait(t, got)
	require.True(t, errors.Is(res.err, os.ErrDeadlineExceeded), "%v", res.err)

	// With the deadline cleared, data written meanwhile is read.
	require.NoError(t, r.SetDeadline(time.Time{}))
	write(t, w, "b")
	r.mu.Lock()
	r.drained = time.Time{}
	r.mu.Unlock()
	n, err := r.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "b", string(buf[:n]))
}
