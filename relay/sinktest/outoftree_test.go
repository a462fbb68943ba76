package sinktest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/tmppg"
)

// The sink seam needs nothing private: testdata/filesink, a module of its
// own outside this module's import path (so Go forbids it every internal
// package), implements a sink that passes this suite and relays with both
// sources. This runs its tests, with a wal_level=logical cluster for the
// WAL source's.
func TestOutOfTreeSink(t *testing.T) {
	t.Parallel()
	ci := os.Getenv("CI") == "true"
	gobin, err := exec.LookPath("go")
	if err != nil {
		if ci {
			t.Fatalf("the out-of-tree sink's tests need the go command on the PATH: %v", err)
		}
		t.Skipf("skipped: the out-of-tree sink's tests need the go command on the PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env := append(os.Environ(), "DATABASE_URL="+pgtest.URL(), "GOFLAGS=-mod=mod")
	// The tests that must have run, not skipped.
	must := []string{"TestSinkConformance", "TestPollingRelay"}
	switch {
	case tmppg.Available():
		cluster, err := tmppg.Logical(ctx, 4, nil)
		if err != nil {
			t.Fatalf("start a wal_level=logical cluster for the out-of-tree sink's WAL test: %v", err)
		}
		t.Cleanup(func() { _ = cluster.Stop() })
		env = append(env, "FILESINK_LOGICAL_URL="+cluster.URL())
		must = append(must, "TestWALRelay")
	case ci:
		t.Fatal("the out-of-tree sink's WAL test needs initdb and pg_ctl on the PATH, for a wal_level=logical cluster")
	default:
		t.Log("initdb and pg_ctl are not on the PATH: the out-of-tree sink's WAL test skips")
	}
	cmd := exec.CommandContext(ctx, gobin, "test", "-count=1", "-v", "./...")
	cmd.Dir = filepath.Join("..", "..", "testdata", "filesink")
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("go test ./... in %s: %v\n%s", cmd.Dir, err, out.String())
	}
	for _, name := range must {
		if !strings.Contains(out.String(), "--- PASS: "+name+" ") {
			t.Errorf("go test ./... in %s did not pass %s:\n%s", cmd.Dir, name, out.String())
		}
	}
}
