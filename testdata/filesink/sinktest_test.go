package filesink_test

import (
	"errors"
	"io/fs"
	"os"
	"testing"

	"github.com/pgoutbox/outbox/relay/sinktest"

	"example.com/filesink"
)

// The file sink passes the sink suite. A destination fails, in a way a
// retry fixes, while a directory stands where its file goes; the sink
// cannot be made to refuse one destination or one message, and the suite
// says so as it skips those cases.
func TestSinkConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{Name: "file", New: func(t *testing.T) *sinktest.Sink {
		sink, err := filesink.New(filesink.Config{Dir: t.TempDir(), MaxBytes: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		return &sinktest.Sink{
			Sink:            sink,
			Read:            func(t *testing.T, dest string, _ int) []sinktest.Delivered { return delivered(t, sink, dest) },
			MaxBytes:        64 << 10,
			FailDestination: func(t *testing.T, dest string) func() { return blockPath(t, sink.Path(dest)) },
		}
	}})
}

func delivered(t *testing.T, sink *filesink.Sink, dest string) []sinktest.Delivered {
	t.Helper()
	lines, err := sink.Read(dest)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]sinktest.Delivered, 0, len(lines))
	for _, l := range lines {
		out = append(out, sinktest.Delivered{ID: l.ID, Key: l.AggregateID, Type: l.Type, Payload: []byte(l.Payload),
			Headers: l.Headers})
	}
	return out
}

// blockPath puts a directory where the file at path goes (moving the file
// aside), until the returned heal puts the file back.
func blockPath(t *testing.T, path string) (heal func()) {
	t.Helper()
	aside := path + ".aside"
	moved := true
	if err := os.Rename(path, aside); errors.Is(err, fs.ErrNotExist) {
		moved = false
	} else if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o750); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if moved {
			if err := os.Rename(aside, path); err != nil {
				t.Fatal(err)
			}
		}
	}
}
