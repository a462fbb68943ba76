package redispub_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
)

// faultProxy sits between the publisher and a real Redis server and
// rewrites the commands it forwards, so that the server itself answers
// with the failure a test needs for one message or one stream: Redis has
// no way to fail one key, or one entry of a script, on its own. Replies
// pass through unchanged.
type faultProxy struct {
	ln       net.Listener
	upstream string

	mu     sync.Mutex
	faults []fault
}

// fault looks at one command (its arguments) and returns the command to
// forward instead, or drop to cut the connection before forwarding it.
type fault func(args []string) (out []string, drop bool)

func startProxy(t *testing.T, upstream string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, upstream: upstream}
	t.Cleanup(func() { ln.Close() })
	go p.serve()
	return p
}

func (p *faultProxy) Addr() string { return p.ln.Addr().String() }

// add installs f and returns what removes it.
func (p *faultProxy) add(f fault) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = append(p.faults, f)
	n := len(p.faults) - 1
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.faults[n] = nil
	}
}

func (p *faultProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *faultProxy) handle(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	defer up.Close()
	go func() {
		_, _ = io.Copy(c, up)
		c.Close()
	}()
	r := bufio.NewReader(c)
	w := bufio.NewWriter(up)
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		args, drop := p.rewrite(args)
		if drop {
			return
		}
		writeCommand(w, args)
		if r.Buffered() == 0 {
			if w.Flush() != nil {
				return
			}
		}
	}
}

func (p *faultProxy) rewrite(args []string) ([]string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.faults {
		if f == nil {
			continue
		}
		out, drop := f(args)
		if drop {
			return nil, true
		}
		args = out
	}
	return args, false
}

// readCommand reads one RESP array of bulk strings: how every client
// sends commands.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[0] != '*' {
		return nil, fmt.Errorf("not an array: %q", line)
	}
	n, err := strconv.Atoi(line[1 : len(line)-2])
	if err != nil {
		return nil, err
	}
	args := make([]string, n)
	for i := range args {
		hdr, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(hdr[1 : len(hdr)-2])
		if err != nil || hdr[0] != '$' {
			return nil, fmt.Errorf("not a bulk string: %q", hdr)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}

func writeCommand(w *bufio.Writer, args []string) {
	fmt.Fprintf(w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(w, "$%d\r\n%s\r\n", len(a), a)
	}
}

// publishCall is an EVALSHA of the publish script, as the publisher
// sends it: EVALSHA sha 1 stream maxlen, then per run its entry count,
// and per entry its argument count and its fields and values.
type publishCall struct {
	args   []string
	stream string
}

func asPublishCall(args []string) (publishCall, bool) {
	if len(args) < 5 || args[0] != "evalsha" && args[0] != "EVALSHA" || args[2] != "1" {
		return publishCall{}, false
	}
	return publishCall{args: args, stream: args[3]}, true
}

// entryAt returns the index of the argument count of the entry whose
// event_id is id, or -1.
func (c publishCall) entryAt(id int64) int {
	want := strconv.FormatInt(id, 10)
	for i := 5; i < len(c.args); {
		entries, err := strconv.Atoi(c.args[i])
		if err != nil {
			return -1
		}
		i++
		for range entries {
			n, err := strconv.Atoi(c.args[i])
			if err != nil {
				return -1
			}
			for j := i + 1; j+1 <= i+n && j+1 < len(c.args); j += 2 {
				if c.args[j] == "event_id" && c.args[j+1] == want {
					return i
				}
			}
			i += n + 1
		}
	}
	return -1
}

// withExtraArg returns the call with one argument more in the entry whose
// argument count is at at: an odd number of fields and values, which
// Redis's XADD refuses (wrong number of arguments).
func (c publishCall) withExtraArg(at int) []string {
	n, _ := strconv.Atoi(c.args[at])
	out := append([]string{}, c.args[:at]...)
	out = append(out, strconv.Itoa(n+1), "extra")
	return append(out, c.args[at+1:]...)
}
