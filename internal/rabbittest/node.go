package rabbittest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// NodeOptions configures a private node.
type NodeOptions struct {
	// MaxMessageSize is the node's max_message_size in bytes. Defaults to
	// 0 (RabbitMQ's own default, 128 MiB).
	MaxMessageSize int
}

// Node is a private RabbitMQ node on ports of its own, with its own
// data, which a test may kill and start again.
type Node struct {
	t    testing.TB
	bin  string
	dir  string
	env  []string
	port int
	name string
	cmd  *exec.Cmd
}

// bootTimeout bounds a node's start; one takes several seconds, more on a
// loaded machine.
const bootTimeout = 3 * time.Minute

// StartNode starts a private node and waits until it takes connections;
// it is killed and its data removed when t ends. Without rabbitmq-server
// it skips t, or fails it in CI (CI=true).
func StartNode(t testing.TB, opts NodeOptions) *Node {
	t.Helper()
	bin := findServer()
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("rabbittest: rabbitmq-server is not installed, and CI must run the private-node tests")
		}
		t.Skip("rabbittest: rabbitmq-server is not installed (apt-get install rabbitmq-server)")
	}
	reapOrphans()
	dir, err := os.MkdirTemp("", "rabbittest-")
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644))
	n := &Node{t: t, bin: bin, dir: dir, port: freePort(t)}
	n.name = fmt.Sprintf("rabbit-test-%d@localhost", n.port)
	conf := fmt.Sprintf("listeners.tcp.1 = 127.0.0.1:%d\n", n.port)
	if opts.MaxMessageSize > 0 {
		conf += fmt.Sprintf("max_message_size = %d\n", opts.MaxMessageSize)
	}
	must(t, os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "enabled_plugins"), nil, 0o644))
	// The server drops root for the rabbitmq user, which must own its
	// files.
	if u, err := user.Lookup("rabbitmq"); err == nil && os.Geteuid() == 0 {
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		must(t, filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Chown(p, uid, gid)
		}))
	}
	n.env = append(os.Environ(),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(freePort(t)),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
	)
	t.Cleanup(func() {
		n.Kill()
		_ = os.RemoveAll(dir)
	})
	n.Start()
	return n
}

// reapOrphans kills the nodes of test processes that died without their
// cleanup (a test binary's timeout panics), which would run on for ever,
// and removes their data.
func reapOrphans() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "rabbittest-*"))
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue
		}
		owner, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil {
			continue
		}
		if err := syscall.Kill(owner, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // its owner still runs
		}
		if raw, err := os.ReadFile(filepath.Join(dir, "pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(dir)
	}
}

func findServer() string {
	if p, err := exec.LookPath("rabbitmq-server"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/rabbitmq-server"); err == nil {
		return "/usr/sbin/rabbitmq-server"
	}
	return ""
}

// Name is the node's Erlang name, for rabbitmqctl -n.
func (n *Node) Name() string { return n.name }

// Ctl runs rabbitmqctl against the node, failing t when it fails.
func (n *Node) Ctl(args ...string) {
	n.t.Helper()
	out, err := exec.Command("rabbitmqctl", append([]string{"-n", n.name}, args...)...).CombinedOutput()
	if err != nil {
		n.t.Fatalf("rabbittest: rabbitmqctl %v: %v: %s", args, err, out)
	}
}

// URL is the node's AMQP URL (guest, which a node lets in from
// localhost).
func (n *Node) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port) }

// Start starts the node (again, after Kill, on its data) and waits until
// it takes connections.
func (n *Node) Start() {
	n.t.Helper()
	out, err := os.OpenFile(filepath.Join(n.dir, "server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must(n.t, err)
	defer out.Close()
	cmd := exec.Command(n.bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = n.env, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must(n.t, cmd.Start())
	n.cmd = cmd
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(bootTimeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			n.t.Fatalf("rabbittest: node %s exited while starting (%v): %s", n.name, err, n.tail())
		default:
		}
		if conn, err := amqp.Dial(n.URL()); err == nil {
			_ = conn.Close()
			go func() { <-exited }()
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	n.t.Fatalf("rabbittest: node %s did not take connections within %s: %s", n.name, bootTimeout, n.tail())
}

// Kill kills the node at once (SIGKILL), as a crash does; its data stays
// for Start.
func (n *Node) Kill() {
	if raw, err := os.ReadFile(filepath.Join(n.dir, "pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if n.cmd != nil && n.cmd.Process != nil {
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	}
	_ = os.Remove(filepath.Join(n.dir, "pid"))
	// Wait for the port to close, so a Start after this binds it again.
	for i := 0; i < 100; i++ {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.port), 100*time.Millisecond)
		if err != nil {
			return
		}
		_ = c.Close()
		time.Sleep(100 * time.Millisecond)
	}
}

func (n *Node) tail() string {
	raw, _ := os.ReadFile(filepath.Join(n.dir, "server.out"))
	if len(raw) > 2000 {
		raw = raw[len(raw)-2000:]
	}
	return string(raw)
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
