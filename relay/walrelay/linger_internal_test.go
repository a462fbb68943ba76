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
	buf := make([]byte, 64)
	write(t, w, "a")
	n, err := r.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "a", string(buf[:n]))
	r.mu.Lock()
	drained := r.drained
	r.mu.Unlock()
	require.False(t, drained.IsZero(), "a short read drains")
	go func() {
		for _, s := range []string{"b", "c", "d"} {
			time.Sleep(10 * time.Millisecond)
			_, _ = w.Write([]byte(s))
		}
	}()
	n, err = r.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "bcd", string(buf[:n]), "three writes, one read")
	require.GreaterOrEqual(t, time.Since(drained), linger, "the read waited out the linger")
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
	buf := make([]byte, 64)
	write(t, w, "a")
	_, err := r.Read(buf)
	require.NoError(t, err)

	start := time.Now()
	require.NoError(t, r.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err = r.Read(buf)
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
	require.Less(t, time.Since(start), linger/2)

	require.NoError(t, r.SetReadDeadline(time.Time{}))
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = r.SetDeadline(time.Unix(1, 0)) // as pgconn's deadline handler cancels
	}()
	start = time.Now()
	_, err = r.Read(buf)
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
	require.Less(t, time.Since(start), linger/2)

	// A deadline set during the wait, sooner than its end, ends it then.
	require.NoError(t, r.SetReadDeadline(time.Time{}))
	r.mu.Lock()
	r.drained = time.Now()
	r.mu.Unlock()
	go func() {
		time.Sleep(20 * time.Millisecond)
		_ = r.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	}()
	start = time.Now()
	_, err = r.Read(buf)
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
	require.Less(t, time.Since(start), linger/2)

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
