// Package filesink is a sink for the outbox relayers that lives outside
// the outbox module and uses only its public API: it appends each message
// as one JSON line to a file per destination, <Dir>/<destination>.jsonl,
// and acknowledges a message only once its line is on disk (fsync).
//
// It is the proof that the sink seam needs nothing private: it implements
// relay.Sink (with an outbox.Routing of its own, unlike Kafka's), passes
// relay/sinktest, and relays with both sources
// (relay.New and walrelay.New).
//
//	sink, err := filesink.New(filesink.Config{Dir: "/var/lib/outbox"})
//	r, err := relay.New(relay.Config{Pool: pool, Sink: sink})
package filesink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/relay"
)

// DefaultMaxBytes is the largest payload a Sink takes by default: the
// producer's default limit.
const DefaultMaxBytes = 1 << 20

// Config configures a Sink.
type Config struct {
	// Dir holds one file per destination. Required; created when missing.
	Dir string
	// MaxBytes is the largest payload the sink takes; a larger one fails
	// permanently as relay.ReasonTooLarge. Defaults to DefaultMaxBytes.
	MaxBytes int
}

// Line is one message as the sink writes it: one JSON object a line.
// Payload holds the message's JSON as a string, byte for byte (a JSON
// encoder would re-space and re-escape it inline).
type Line struct {
	ID          int64             `json:"id"`
	AggregateID string            `json:"aggregate_id"`
	Type        string            `json:"type"`
	Payload     string            `json:"payload"`
	Headers     map[string]string `json:"headers,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
}

// Sink appends messages to files; see the package doc. It is safe for
// concurrent use.
type Sink struct {
	dir      string
	maxBytes int
	mu       sync.Mutex // one writer at a time: lines never interleave
}

// New checks cfg and creates Dir when missing.
func New(cfg Config) (*Sink, error) {
	if cfg.Dir == "" {
		return nil, errors.New("filesink: Config.Dir is required: name the directory the destination files go to")
	}
	if cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("filesink: Config.MaxBytes is %d; use a positive size, or 0 for %d", cfg.MaxBytes, DefaultMaxBytes)
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("filesink: create %s: %w", cfg.Dir, err)
	}
	return &Sink{dir: cfg.Dir, maxBytes: cfg.MaxBytes}, nil
}

// validDest is what a destination may be named: it becomes a file name.
var validDest = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}$`)

// Path is the file of destination dest.
func (s *Sink) Path(dest string) string { return filepath.Join(s.dir, dest+".jsonl") }

// errNotSent marks a message left unwritten because an earlier message of
// its aggregate failed in the same call.
var errNotSent = errors.New("filesink: not written: an earlier message of its aggregate failed")

// pending is the lines waiting to be written to one destination.
type pending struct {
	dest string
	idx  []int
	buf  []byte
}

// Publish writes msgs in order, one fsync per destination written, and
// returns one error per message: permanent for a destination name that is
// no file name and for a payload over MaxBytes; the write's error, which a
// retry may fix, for the lines of a destination whose file could not be
// appended to and synced. A message after a failed one of its aggregate
// is not written.
func (s *Sink) Publish(ctx context.Context, msgs []relay.Message) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, len(msgs))
	failed := map[uuid.UUID]bool{}
	var batch []*pending               // in order of first use
	inFlight := map[uuid.UUID]string{} // aggregate -> the destination its unwritten lines go to
	flush := func() {
		for _, p := range batch {
			if err := s.append(p); err != nil {
				for _, i := range p.idx {
					errs[i] = err
					failed[msgs[i].AggregateID] = true
				}
			}
		}
		batch, inFlight = nil, map[uuid.UUID]string{}
	}
	for i := range msgs {
		m := &msgs[i]
		if err := ctx.Err(); err != nil {
			errs[i] = err
			failed[m.AggregateID] = true
			continue
		}
		// An aggregate's lines to another destination are written first,
		// so that a failure there is known before this one is sent.
		if d, ok := inFlight[m.AggregateID]; ok && d != m.Topic {
			flush()
		}
		if failed[m.AggregateID] {
			errs[i] = errNotSent
			continue
		}
		if err := s.check(m); err != nil {
			errs[i] = err
			failed[m.AggregateID] = true
			continue
		}
		line, err := json.Marshal(Line{ID: m.ID, AggregateID: m.AggregateID.String(), Type: m.Type, Payload: string(m.Payload),
			Headers: m.Headers, CreatedAt: m.CreatedAt.UTC()})
		if err != nil {
			errs[i] = relay.PermanentReason(relay.ReasonUndecodable, fmt.Errorf("filesink: encode message %d: %w", m.ID, err))
			failed[m.AggregateID] = true
			continue
		}
		var p *pending
		for _, q := range batch {
			if q.dest == m.Topic {
				p = q
			}
		}
		if p == nil {
			p = &pending{dest: m.Topic}
			batch = append(batch, p)
		}
		p.idx = append(p.idx, i)
		p.buf = append(append(p.buf, line...), '\n')
		inFlight[m.AggregateID] = m.Topic
	}
	flush()
	return errs
}

// Routing routes an event type to the file named by prefix and the type
// up to its first '.': "order.placed" goes to order.jsonl. Producers that
// write for this sink pass the same routing (outbox.Config.Routing), so
// that Emit refuses what the sink would.
func (s *Sink) Routing(prefix string) (outbox.Routing, error) {
	if prefix != "" && !validDest.MatchString(prefix+"x") {
		return nil, fmt.Errorf("filesink: prefix %q cannot start a file name (letters, digits, '.', '_', '-')", prefix)
	}
	return routing{prefix: prefix, maxBytes: s.maxBytes}, nil
}

// ErrorCode names Publish's errors for metrics: the hold reason of a
// permanent one, "io" for a failed write.
func (s *Sink) ErrorCode(err error) string {
	if relay.IsPermanent(err) {
		return relay.ReasonOf(err)
	}
	return "io"
}

// routing is the sink's outbox.Routing.
type routing struct {
	prefix   string
	maxBytes int
}

func (r routing) Destination(eventType string) (string, error) {
	base, _, _ := strings.Cut(eventType, ".")
	dest := r.prefix + base
	if base == "" || !validDest.MatchString(dest) {
		return "", fmt.Errorf("%w: type %q routes to %q, which is not a file name (letters, digits, '.', '_', '-'; at most 200)", outbox.ErrInvalidTopic, eventType, dest)
	}
	return dest, nil
}

// Size is the payload's: the sink limits payloads, not lines.
func (r routing) Size(_ string, payloadLen int, _ map[string]string) int { return payloadLen }

func (r routing) Limit() outbox.SizeLimit {
	return outbox.SizeLimit{Bytes: r.maxBytes, Unit: "a payload", Seen: "as the file sink writes it", Raise: "filesink's Config.MaxBytes"}
}

// check refuses, permanently, what no retry will write.
func (s *Sink) check(m *relay.Message) error {
	if !validDest.MatchString(m.Topic) {
		return relay.PermanentReason(relay.ReasonInvalidTopic, fmt.Errorf(
			"filesink: destination %q is not a file name (letters, digits, '.', '_', '-'; at most 200): route the type %q elsewhere", m.Topic, m.Type))
	}
	if len(m.Payload) > s.maxBytes {
		return relay.PermanentReason(relay.ReasonTooLarge, fmt.Errorf(
			"filesink: message %d's payload is %d bytes; the sink takes at most %d (raise Config.MaxBytes and retry the row, or park it)", m.ID, len(m.Payload), s.maxBytes))
	}
	return nil
}

// append writes p's lines to its file and syncs it (and the directory,
// for a new file). On a failed write the file is cut back to its old
// size, so that no torn line stays behind for the retry to follow.
func (s *Sink) append(p *pending) error {
	path := s.Path(p.dest)
	_, statErr := os.Stat(path)
	created := errors.Is(statErr, fs.ErrNotExist)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("filesink: open %s: %w; fix the path and the relayer retries", path, err)
	}
	defer f.Close() //nolint:errcheck // synced or reported below
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("filesink: stat %s: %w", path, err)
	}
	if _, err := f.Write(p.buf); err != nil {
		_ = f.Truncate(info.Size())
		return fmt.Errorf("filesink: append to %s: %w; free space or fix the file and the relayer retries", path, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Truncate(info.Size())
		return fmt.Errorf("filesink: sync %s: %w", path, err)
	}
	if created {
		if err := syncDir(s.dir); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("filesink: open %s to sync it: %w", dir, err)
	}
	defer d.Close() //nolint:errcheck // read-only
	if err := d.Sync(); err != nil {
		return fmt.Errorf("filesink: sync %s: %w", dir, err)
	}
	return nil
}

// Read returns the lines of destination dest's file, in order; none when
// it does not exist.
func (s *Sink) Read(dest string) ([]Line, error) {
	data, err := os.ReadFile(s.Path(dest))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Line
	dec := json.NewDecoder(bytes.NewReader(data))
	for dec.More() {
		var l Line
		if err := dec.Decode(&l); err != nil {
			return out, fmt.Errorf("filesink: %s: line %d: %w", s.Path(dest), len(out)+1, err)
		}
		out = append(out, l)
	}
	return out, nil
}
