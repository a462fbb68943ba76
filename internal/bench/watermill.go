package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pgoutbox/outbox/relay"
)

// wmResult is the JSON line bench/watermill prints.
type wmResult struct {
	Events     int64   `json:"events"`
	Published  int64   `json:"published"`
	Seconds    float64 `json:"seconds"`
	EventsPerS float64 `json:"events_per_s"`
	BatchSize  int     `json:"batch_size"`
	PollMS     float64 `json:"poll_ms"`
	Watermill  string  `json:"watermill"`
}

// runWatermill builds the bench/watermill module into a temporary
// directory (so compile time is not timed and the outbox module never
// depends on Watermill) and runs it against the same server and broker
// settings. It preloads its own table with the same number of events and
// aggregates.
func (s *session) runWatermill(ctx context.Context, events int64) (wmResult, error) {
	var res wmResult
	dir := s.cfg.WatermillDir
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return res, fmt.Errorf("no Watermill module at %s (%v); run from the repository root or pass --watermill-dir path/to/bench/watermill", dir, err)
	}
	tmp, err := os.MkdirTemp("", "outbox-bench-watermill-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "watermill-bench")
	s.progress("watermill: building %s (downloads Watermill through the Go module proxy the first time)", dir)
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = dir
	var out bytes.Buffer
	build.Stdout, build.Stderr = &out, &out
	if err := build.Run(); err != nil {
		return res, fmt.Errorf("go build in %s: %w: %s", dir, err, strings.TrimSpace(out.String()))
	}
	args := []string{"--json", "--events", strconv.FormatInt(events, 10), "--aggregates", strconv.Itoa(s.cfg.Aggregates), "--database-url", s.cfg.DatabaseURL}
	if len(s.cfg.Kafka.Brokers) > 0 {
		args = append(args, "--brokers", strings.Join(s.cfg.Kafka.Brokers, ","))
	}
	s.progress("watermill: forwarding %d events", events)
	run := exec.CommandContext(ctx, bin, args...)
	var stdout bytes.Buffer
	run.Stdout, run.Stderr = &stdout, s.cfg.Progress
	if err := run.Run(); err != nil {
		return res, fmt.Errorf("watermill bench: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		return res, fmt.Errorf("watermill bench printed %q: %w", stdout.String(), err)
	}
	if res.Events != events || res.Published < events {
		return res, fmt.Errorf("watermill forwarded %d and the broker holds %d of %d events", res.Events, res.Published, events)
	}
	return res, nil
}

// wmTable adds Watermill's figure, next to the outbox relay's on the same
// number of events when outbox is not NaN.
func wmTable(res *Result, wm wmResult, outbox float64) {
	t := Table{
		Title:   fmt.Sprintf("%s events, same server and broker kind", thousands(wm.Events)),
		Columns: []string{"drainer", "events/s", "seconds", "batch", "poll"},
		Rows: [][]string{{"Watermill forwarder (watermill-sql v4 + watermill-kafka v3)", rate(wm.EventsPerS),
			fmt.Sprintf("%.2f", wm.Seconds), strconv.Itoa(wm.BatchSize), fmt.Sprintf("%g ms", wm.PollMS)}},
	}
	if !math.IsNaN(outbox) {
		t.Rows = append(t.Rows, []string{"outbox relay, 1 relayer, defaults (median)", rate(outbox), fmt.Sprintf("%.2f", float64(wm.Events)/outbox), strconv.Itoa(relay.DefaultBatchSize), "1000 ms (LISTEN)"})
	}
	res.Tables = append(res.Tables, t)
	res.metric("watermill.events_per_s", wm.EventsPerS)
	res.metric("watermill.events", float64(wm.Events))
	res.note("Watermill: %s; preloaded through its forwarder publisher; it publishes one message at a time and waits for each acknowledgement (Sarama SyncProducer)", wm.Watermill)
}

func runWatermillScenario(ctx context.Context, s *session) (*Result, error) {
	res := &Result{}
	n := int64(s.cfg.Events)
	res.param("preload", "%s events over %s aggregates, written through Watermill's forwarder publisher", thousands(n), thousands(int64(s.cfg.Aggregates)))
	res.param("settings", "SubscribeBatchSize 1,000, PollInterval 10 ms (the throughput settings Watermill documents); partition key = aggregate id")
	wm, err := s.runWatermill(ctx, n)
	if err != nil {
		return nil, err
	}
	wmTable(res, wm, math.NaN())
	return res, nil
}
