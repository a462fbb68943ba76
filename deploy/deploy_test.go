package deploy_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/cli"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/tmppg"
	"github.com/pgoutbox/outbox/ops"
)

const aptLine = "apt-get update && apt-get install -y prometheus"

// tool finds a program the test needs: a failure in CI (CI=true), which
// must run every test, a skip elsewhere.
func tool(t *testing.T, name, install string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed (%v); CI must run this test: %s", name, err, install)
		}
		t.Skipf("%s is not installed; to run this test: %s", name, install)
	}
	return p
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
	return string(out)
}

// The rules load, and their unit tests (every alert firing and not
// firing, with its rendered annotations) pass; the example configuration
// is valid.
func TestPromtoolRules(t *testing.T) {
	t.Parallel()
	promtool := tool(t, "promtool", aptLine)
	out := run(t, "prometheus", promtool, "check", "rules", "alerts.yml")
	require.Contains(t, out, "SUCCESS")
	out = run(t, "prometheus", promtool, "test", "rules", "alerts_test.yml")
	require.Contains(t, out, "SUCCESS")
	run(t, "prometheus", promtool, "check", "config", "prometheus.yml")

	// Every alert of alerts.yml has a test in alerts_test.yml that expects
	// it to fire.
	rules, err := os.ReadFile("prometheus/alerts.yml")
	require.NoError(t, err)
	tests, err := os.ReadFile("prometheus/alerts_test.yml")
	require.NoError(t, err)
	names := regexp.MustCompile(`(?m)^\s*- alert: (\S+)$`).FindAllStringSubmatch(string(rules), -1)
	require.NotEmpty(t, names)
	for _, n := range names {
		fires := regexp.MustCompile(`alertname: ` + n[1] + `\n\s+exp_alerts:\n\s+- exp_labels`)
		require.Regexp(t, fires, string(tests), "no test shows %s firing", n[1])
	}
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Title  string `json:"title"`
	UID    string `json:"uid"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("grafana/outbox-dashboard.json")
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(b, &d))
	return d
}

// relayVariableMetrics are the outbox_ metrics the dashboard's relay_job
// template variable reads its jobs from.
func relayVariableMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("grafana/outbox-dashboard.json")
	require.NoError(t, err)
	var d struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	for _, v := range d.Templating.List {
		if v.Name == "relay_job" {
			names := metricNames(v.Definition)
			require.NotEmpty(t, names, "relay_job reads no outbox_ metric: %q", v.Definition)
			return names
		}
	}
	t.Fatal("the dashboard has no relay_job variable")
	return nil
}

// dashboardExprs lists every panel's queries, keyed by panel title and
// refId.
func dashboardExprs(d dashboard) map[string]string {
	exprs := map[string]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs[p.Title+" "+tg.RefID] = tg.Expr
		}
	}
	return exprs
}

// The dashboard has the panels the runbook refers to, each with a query.
func TestDashboardPanels(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	require.NotEmpty(t, d.UID)
	var titles []string
	ids := map[int]bool{}
	for _, p := range d.Panels {
		require.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		titles = append(titles, p.Title)
		if p.Type != "row" {
			require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
			for _, tg := range p.Targets {
				require.NotEmpty(t, tg.Expr, "panel %q", p.Title)
			}
		}
	}
	for _, want := range []string{"Pending events", "Lag vs SLO", "Dispatched events/s by topic", "Publish errors/s",
		"Held events by reason", "Stuck events", "Batch duration p99 and batches/s", "Commit-to-publish latency",
		"Consumer events/s", "Consumer dead letters", "Cleanup"} {
		require.Contains(t, titles, want)
	}
	exprs := strings.Join(slices.Collect(mapValues(dashboardExprs(d))), "\n")
	for _, q := range []string{"histogram_quantile(0.99, sum by (le) (rate(outbox_batch_duration_seconds_bucket",
		"histogram_quantile(0.5, sum by (le) (rate(outbox_commit_to_publish_seconds_bucket",
		"histogram_quantile(0.99, sum by (le) (rate(outbox_commit_to_publish_seconds_bucket"} {
		require.Contains(t, exprs, q)
	}
}

func mapValues(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

var (
	quoted     = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	outboxName = regexp.MustCompile(`\boutbox_[a-zA-Z0-9_]*[a-zA-Z0-9]`)
)

// metricNames are the outbox_ metric names a PromQL expression reads:
// identifiers starting with outbox_, outside string literals (label values
// such as job="outbox-relay", legends).
func metricNames(expr string) []string {
	var names []string
	for _, n := range outboxName.FindAllString(quoted.ReplaceAllString(expr, `""`), -1) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"outbox_batch_size_events_sum", "outbox_batch_size_events_count"},
		metricNames(`sum(rate(outbox_batch_size_events_sum{job=~"outbox_x"}[5m])) / sum(rate(outbox_batch_size_events_count[5m]))`))
	require.Equal(t, []string{"outbox_held_events"}, metricNames(`max by (reason) (outbox_held_events{job="outbox-relay", x='outbox_y'})`))
	fams := families{"outbox_batch_duration_seconds": "histogram", "outbox_holds_total": "counter", "outbox_q": "summary"}
	require.True(t, fams.serves("outbox_batch_duration_seconds_bucket"))
	require.True(t, fams.serves("outbox_batch_duration_seconds_count"))
	require.True(t, fams.serves("outbox_holds_total"))
	require.True(t, fams.serves("outbox_q_sum"))
	require.False(t, fams.serves("outbox_q_bucket"), "a summary has no buckets")
	require.False(t, fams.serves("outbox_holds_total_count"), "a counter has no _count")
	require.False(t, fams.serves("outbox_holds"))
}

// families maps each metric family a /metrics page serves to its type.
type families map[string]string

func parseFamilies(text string) families {
	f := families{}
	for line := range strings.SplitSeq(text, "\n") {
		if fields := strings.Fields(line); len(fields) == 4 && fields[0] == "#" && fields[1] == "TYPE" {
			f[fields[2]] = fields[3]
		}
	}
	return f
}

// serves reports whether a query can read name from these families: a
// family's own name, or a histogram's _bucket, _sum and _count, or a
// summary's _sum and _count.
func (f families) serves(name string) bool {
	if _, ok := f[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		switch f[base] {
		case "histogram":
			return true
		case "summary":
			return suffix != "_bucket"
		}
	}
	return false
}

// syncBuffer collects a command's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var servingLine = regexp.MustCompile(`msg="serving metrics and health checks" addr=(\S+)`)

// startOutbox runs `outbox args...` in-process against db until the test
// ends, and returns the address of its --http server (pass --http
// 127.0.0.1:0).
func startOutbox(t *testing.T, db *pgtest.DB, args ...string) string {
	t.Helper()
	var stdout, stderr syncBuffer
	root := cli.NewRoot(&stdout, &stderr)
	root.SetArgs(append(args, "--database-url", db.URL, "--schema", db.Tables.Schema))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil || t.Failed() {
				t.Logf("outbox %s: %v; stderr:\n%s", args[0], err, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Errorf("outbox %s did not stop within 30s", args[0])
		}
	})
	var addr string
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("outbox %s stopped: %v\n%s", args[0], err, stderr.String())
		default:
		}
		if m := servingLine.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	}, 60*time.Second, 20*time.Millisecond)
	return addr
}

func get(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", u, b)
	return string(b)
}

// freePort returns a port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// forClause matches the for: of a rule in alerts.yml.
var forClause = regexp.MustCompile(`(?m)^(\s+for:) \S+$`)

// promServer is a Prometheus server process.
type promServer struct {
	url string
}

// startPrometheus runs prometheus on a free port with its own data
// directory, scraping every second the relay and consumer at the given
// addresses, and evaluating alerts.yml every second with every for:
// shortened to 1s (the copy in the temporary directory is rewritten: a test
// cannot wait 10 minutes). It is stopped at the end of the test.
func startPrometheus(t *testing.T, prometheus, relayAddr, consumerAddr string) *promServer {
	t.Helper()
	dir := t.TempDir()
	rules, err := os.ReadFile("prometheus/alerts.yml")
	require.NoError(t, err)
	require.NotEmpty(t, forClause.FindAll(rules, -1))
	rules = forClause.ReplaceAll(rules, []byte("$1 1s"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "alerts.yml"), rules, 0o644))
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [alerts.yml]
scrape_configs:
  - job_name: outbox-relay
    static_configs: [{targets: [%q]}]
  - job_name: outbox-consumer
    static_configs: [{targets: [%q]}]
`, relayAddr, consumerAddr)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644))

	var out syncBuffer
	var cmd *exec.Cmd
	var addr string
	// A free port can be taken between freePort and prometheus's bind:
	// try again on another.
	for attempt := 0; ; attempt++ {
		addr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		out = syncBuffer{}
		cmd = exec.Command(prometheus,
			"--config.file="+filepath.Join(dir, "prometheus.yml"),
			"--storage.tsdb.path="+filepath.Join(dir, "data"),
			"--web.listen-address="+addr,
			"--log.level=warn")
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		ready := false
		require.Eventually(t, func() bool {
			select {
			case err := <-exited:
				exited <- err
				return true
			default:
			}
			resp, err := http.Get("http://" + addr + "/-/ready")
			if err != nil {
				return false
			}
			resp.Body.Close()
			ready = resp.StatusCode == http.StatusOK
			return ready
		}, 60*time.Second, 50*time.Millisecond, "prometheus did not start:\n%s", out.String())
		if ready {
			t.Cleanup(func() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(30 * time.Second):
					_ = cmd.Process.Kill()
					<-exited
				}
				if t.Failed() {
					t.Logf("prometheus output:\n%s", out.String())
				}
			})
			return &promServer{url: "http://" + addr}
		}
		require.Less(t, attempt, 3, "prometheus exited:\n%s", out.String())
	}
}

// api calls a Prometheus HTTP API endpoint and decodes its data.
func (p *promServer) api(t *testing.T, path string, q url.Values, data any) {
	t.Helper()
	u := p.url + path
	if q != nil {
		u += "?" + q.Encode()
	}
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(get(t, u)), &body), u)
	require.Equal(t, "success", body.Status, "%s: %s", u, body.Error)
	require.NoError(t, json.Unmarshal(body.Data, data))
}

// firing lists the alerts Prometheus has firing.
func (p *promServer) firing(t *testing.T) map[string]bool {
	t.Helper()
	var data struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	p.api(t, "/api/v1/alerts", nil, &data)
	names := map[string]bool{}
	for _, a := range data.Alerts {
		if a.State == "firing" {
			names[a.Labels["alertname"]] = true
		}
	}
	return names
}

// up reports whether Prometheus has scraped job successfully.
func (p *promServer) up(t *testing.T, job string) bool {
	t.Helper()
	var data struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	p.api(t, "/api/v1/query", url.Values{"query": {`up{job="` + job + `"}`}}, &data)
	return len(data.Result) == 1 && data.Result[0].Value[1] == "1"
}

// The deploy kit against the real thing: a relay and a consumer started by
// the CLI (each with --http), a real Prometheus server scraping them and
// evaluating alerts.yml (for: shortened to 1s in its copy). A row larger
// than the broker accepts is held: OutboxHeldEvents and OutboxStuckEvents
// fire; parked, they resolve. A record that is not an outbox event is
// dead-lettered by the consumer: OutboxConsumerDeadLetters fires. Every
// metric name the dashboard and the rules read is served by the live relay
// or consumer, and every dashboard query evaluates on the server.
func TestAlertsOnALiveRelay(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a relay, a consumer and a Prometheus server")
	}
	prometheus := tool(t, "prometheus", aptLine)
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	const maxMessage = 10_000
	broker, err := devkafka.Start(devkafka.Config{Partitions: 1, MaxMessageBytes: maxMessage})
	require.NoError(t, err)
	t.Cleanup(broker.Close)

	emit := func(typ string, payload any) int64 {
		var id int64
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
			if err != nil {
				return err
			}
			id, err = p.Emit(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: typ, Payload: payload})
			return err
		}))
		return id
	}
	emit("order.placed", map[string]string{"order_id": "o-1"})
	// Random hex: franz-go compresses, so the record must be large however
	// it is sent.
	big := make([]byte, 4*maxMessage)
	_, _ = rand.Read(big)
	held := emit("order.placed", map[string]string{"blob": hex.EncodeToString(big)})

	relayAddr := startOutbox(t, db, "relay", "--brokers", broker.Addr(), "--http", "127.0.0.1:0",
		"--stuck-after", "1s", "--metrics-refresh", "200ms", "--poll-interval", "100ms", "--cleanup-interval", "1m")
	consumerAddr := startOutbox(t, db, "consume", "--brokers", broker.Addr(), "--topics", "order",
		"--name", "deploytest", "--quiet", "--http", "127.0.0.1:0")
	prom := startPrometheus(t, prometheus, relayAddr, consumerAddr)

	// The row is held as too_large; the alerts on it fire.
	require.Eventually(t, func() bool {
		f := prom.firing(t)
		return f["OutboxHeldEvents"] && f["OutboxStuckEvents"]
	}, 120*time.Second, 250*time.Millisecond, "held and stuck alerts never fired; firing: %v", prom.firing(t))
	require.False(t, prom.firing(t)["OutboxRelayNotDispatching"], "a held row is the held alert's, not this one's")
	require.Contains(t, get(t, "http://"+relayAddr+"/metrics"), `outbox_held_events{reason="too_large"} 1`)

	// The consumer dead-letters a record that is no outbox event, once
	// Prometheus has seen its counter at 0 (a counter's first sample is
	// no increase).
	require.Eventually(t, func() bool { return prom.up(t, "outbox-consumer") }, 60*time.Second, 100*time.Millisecond)
	time.Sleep(2 * time.Second) // two scrapes of the zero
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker.Addr()))
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: "order", Value: []byte("not an outbox event")}).FirstErr())
	require.Eventually(t, func() bool { return prom.firing(t)["OutboxConsumerDeadLetters"] },
		120*time.Second, 250*time.Millisecond, "dead-letter alert never fired; firing: %v", prom.firing(t))

	// Every metric the dashboard and the rules read is served, by the
	// relay or the consumer (all of them exist by now: a dispatch, a hold,
	// a cleanup and a dead letter have happened).
	relayFams := parseFamilies(get(t, "http://"+relayAddr+"/metrics"))
	consumerFams := parseFamilies(get(t, "http://"+consumerAddr+"/metrics"))
	served := func(name string) bool { return relayFams.serves(name) || consumerFams.serves(name) }
	d := readDashboard(t)
	seen := 0
	for panel, expr := range dashboardExprs(d) {
		names := metricNames(expr)
		require.NotEmpty(t, names, "%s: %s reads no outbox metric", panel, expr)
		for _, n := range names {
			require.True(t, served(n), "dashboard panel %s reads %s, which neither the relay nor the consumer serves", panel, n)
			seen++
		}
		// And the query is valid PromQL that evaluates, with Grafana's
		// variables filled in.
		q := strings.NewReplacer("$__rate_interval", "1m", "$relay_job", "outbox-relay", "$consumer_job", "outbox-consumer").Replace(expr)
		var res json.RawMessage
		prom.api(t, "/api/v1/query", url.Values{"query": {q}}, &res)
	}
	t.Logf("dashboard: %d queries, %d metric references, all served", len(dashboardExprs(d)), seen)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Name  string `json:"name"`
				Query string `json:"query"`
			} `json:"rules"`
		} `json:"groups"`
	}
	prom.api(t, "/api/v1/rules", nil, &rules)
	nrules := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			nrules++
			for _, n := range metricNames(r.Query) {
				// outbox_wal_* are served by a --mode wal relay only:
				// TestWALRelayServesRuleMetrics checks them against one.
				if strings.HasPrefix(n, "outbox_wal_") {
					continue
				}
				// outbox_partition* are served for a partitioned outbox
				// only: ops/monitor's TestMonitorKeepsPartitions reads them.
				if strings.HasPrefix(n, "outbox_partition") {
					continue
				}
				// outbox_lane_* are served once a relay with
				// --exactly-once opened a lane: TestWALRelayServesRuleMetrics
				// and TestExactlyOncePollingRelayServesLaneMetrics read them.
				if strings.HasPrefix(n, "outbox_lane_") {
					continue
				}
				require.True(t, served(n), "alert %s reads %s, which neither the relay nor the consumer serves", r.Name, n)
			}
		}
	}
	file, err := os.ReadFile("prometheus/alerts.yml")
	require.NoError(t, err)
	require.Equal(t, len(regexp.MustCompile(`(?m)^\s*- alert: `).FindAll(file, -1)), nrules, "Prometheus loaded every rule")

	// Park the held row: the held and stuck alerts resolve.
	res, err := ops.Park(ctx, db.Pool, ops.ParkConfig{Tables: db.Tables, ID: held, Reason: "deploy test", Apply: true})
	require.NoError(t, err, "%+v", res)
	require.Eventually(t, func() bool {
		f := prom.firing(t)
		return !f["OutboxHeldEvents"] && !f["OutboxStuckEvents"]
	}, 120*time.Second, 250*time.Millisecond, "held and stuck alerts did not resolve; firing: %v", prom.firing(t))
	for _, job := range []string{"outbox-relay", "outbox-consumer"} {
		require.True(t, prom.up(t, job), job)
	}
	require.False(t, prom.firing(t)["OutboxRelayMissing"])
}

var (
	staticOnce sync.Once
	staticBin  string
	staticErr  error
)

// staticBinary builds ./cmd/outbox once per test run, as the Dockerfile
// does: CGO_ENABLED=0 -trimpath -ldflags "-s -w".
func staticBinary(t *testing.T) string {
	t.Helper()
	goTool := tool(t, "go", "install Go")
	staticOnce.Do(func() {
		dir, err := os.MkdirTemp("", "outbox-deploy-")
		if err != nil {
			staticErr = err
			return
		}
		staticBin = filepath.Join(dir, "outbox")
		cmd := exec.Command(goTool, "build", "-trimpath", "-ldflags", "-s -w", "-o", staticBin, "github.com/pgoutbox/outbox/cmd/outbox")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			staticErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	require.NoError(t, staticErr)
	return staticBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if staticBin != "" {
		_ = os.RemoveAll(filepath.Dir(staticBin))
	}
	os.Exit(code)
}

// The image's build line gives a static binary: no program interpreter,
// no shared libraries (the Dockerfile copies it into distroless/static).
// Docker itself is not run: the image is not built here.
func TestStaticBinary(t *testing.T) {
	t.Parallel()
	dockerfile, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	for _, s := range []string{"FROM golang:1.26 AS build", `RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/outbox ./cmd/outbox`,
		"FROM gcr.io/distroless/static", "USER nonroot", `ENTRYPOINT ["outbox"]`, `CMD ["relay"]`} {
		require.Contains(t, string(dockerfile), s)
	}
	if testing.Short() {
		t.Skip("builds the binary without cgo")
	}
	bin := staticBinary(t)
	f, err := elf.Open(bin)
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "the binary asks for a dynamic loader")
	}
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	require.Empty(t, libs)
	require.Nil(t, f.Section(".symtab"), "-s strips the symbol table")
	var version bytes.Buffer
	v := exec.Command(bin, "--version")
	v.Stdout, v.Stderr = &version, &version
	require.NoError(t, v.Run(), version.String())
}

// systemd accepts the unit (with ExecStart pointed at a built binary:
// verify checks that the command exists), and it stops the relay
// gracefully: SIGTERM, with more time than the relay's shutdown timeout.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	unit, err := os.ReadFile("systemd/outbox-relay.service")
	require.NoError(t, err)
	s := string(unit)
	for _, want := range []string{"DynamicUser=yes", "EnvironmentFile=/etc/outbox/relay.env", "Restart=on-failure", "KillSignal=SIGTERM",
		"ExecStart=/usr/local/bin/outbox relay "} {
		require.Contains(t, s, want)
	}
	shutdown := regexp.MustCompile(`--shutdown-timeout (\S+)`).FindStringSubmatch(s)
	require.NotNil(t, shutdown, "ExecStart sets --shutdown-timeout")
	stop := regexp.MustCompile(`(?m)^TimeoutStopSec=(\S+)$`).FindStringSubmatch(s)
	require.NotNil(t, stop)
	sd, err := time.ParseDuration(shutdown[1])
	require.NoError(t, err)
	td, err := time.ParseDuration(stop[1])
	require.NoError(t, err)
	require.Greater(t, td, sd, "TimeoutStopSec must exceed --shutdown-timeout, or systemd kills the relay mid-batch")

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the unit was checked by reading only")
	}
	if testing.Short() {
		t.Skip("builds the binary for systemd-analyze verify")
	}
	bin := staticBinary(t)
	path := filepath.Join(t.TempDir(), "outbox-relay.service")
	require.NoError(t, os.WriteFile(path, []byte(strings.ReplaceAll(s, "/usr/local/bin/outbox", bin)), 0o644))
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) && strings.Contains(string(out), "Failed to initialize manager") {
		t.Skipf("systemd-analyze cannot run here: %s", out)
	}
	require.NoError(t, err, "systemd-analyze verify:\n%s", out)
	require.NotContains(t, string(out), "outbox-relay.service", "systemd-analyze warns about the unit:\n%s", out)
}

// ruleExprs reads the expr: lines of alerts.yml (every rule's is one line).
func ruleExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("prometheus/alerts.yml")
	require.NoError(t, err)
	var exprs []string
	for _, m := range regexp.MustCompile(`(?m)^\s+expr: (.+)$`).FindAllStringSubmatch(string(b), -1) {
		exprs = append(exprs, m[1])
	}
	require.NotEmpty(t, exprs)
	return exprs
}

// A relay started with --mode wal --http on a throwaway wal_level=logical
// cluster serves every outbox_wal_* metric the rules read (the poll-mode
// live test skips those names), and the series OutboxRelayMetricsAbsent
// accepts from a WAL relay, with the slot's state read from the server.
func TestWALRelayServesRuleMetrics(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a throwaway Postgres cluster and a WAL relay")
	}
	if !tmppg.Available() {
		if os.Getenv("CI") == "true" {
			t.Fatal("initdb and pg_ctl are not on the PATH; CI must run this test (install the PostgreSQL server binaries)")
		}
		t.Skip("initdb and pg_ctl are not on the PATH: a --mode wal relay needs a throwaway wal_level=logical cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	cluster, err := tmppg.Logical(ctx, 4, nil)
	cancel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() }) // after the relay stopped: cleanups run last-in first-out
	db := pgtest.New(t, pgtest.Options{MaxConns: 4, ServerURL: cluster.URL()})
	broker, err := devkafka.Start(devkafka.Config{Partitions: 1})
	require.NoError(t, err)
	t.Cleanup(broker.Close)

	// With --exactly-once: it serves what every WAL relay does, and its
	// lanes' counters.
	addr := startOutbox(t, db, "relay", "--mode", "wal", "--brokers", broker.Addr(), "--http", "127.0.0.1:0",
		"--metrics-refresh", "100ms", "--leader-poll-interval", "100ms", "--cleanup-interval", "1m", "--exactly-once")
	var metrics string
	require.Eventually(t, func() bool {
		metrics = get(t, "http://"+addr+"/metrics")
		return strings.Contains(metrics, "outbox_wal_leader 1") && strings.Contains(metrics, `outbox_wal_slot_wal_status{status="reserved"} 1`)
	}, 60*time.Second, 50*time.Millisecond, "the WAL relay never led with a reserved slot:\n%s", metrics)
	require.Contains(t, metrics, "outbox_wal_slot_active 1")
	checked := 0
	require.Eventually(t, func() bool {
		metrics = get(t, "http://"+addr+"/metrics")
		return strings.Contains(metrics, `outbox_lane_events_total{event="opened"} 1`)
	}, 60*time.Second, 50*time.Millisecond, "the exactly-once WAL relay never counted its lane opened:\n%s", metrics)
	fams := parseFamilies(metrics)
	for _, expr := range ruleExprs(t) {
		for _, n := range metricNames(expr) {
			if strings.HasPrefix(n, "outbox_wal_") || strings.HasPrefix(n, "outbox_lane_") {
				require.True(t, fams.serves(n), "a rule reads %s, which the --mode wal relay does not serve", n)
				checked++
			}
		}
	}
	require.Positive(t, checked)
	// The dashboard lists the relay's jobs from a metric a WAL relay
	// serves too, or it is empty for one.
	for _, n := range relayVariableMetrics(t) {
		require.True(t, fams.serves(n), "the dashboard's relay_job variable reads %s, which the --mode wal relay does not serve", n)
	}
	for _, n := range []string{"outbox_events_dispatched_total", "outbox_wal_slot_lag_seconds", "outbox_wal_parked_total",
		"outbox_wal_heartbeats_total", "outbox_wal_dropped_total", "outbox_cleanup_last_success_timestamp_seconds"} {
		require.True(t, fams.serves(n), "the --mode wal relay does not serve %s", n)
	}
	require.Contains(t, get(t, "http://"+addr+"/readyz"), "database: ok")
}

// A polling relay with --exactly-once serves its lanes' counters once it
// has taken a lane, which it does at start: every outbox_lane_ metric the
// rules read.
func TestExactlyOncePollingRelayServesLaneMetrics(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 6})
	broker, err := devkafka.Start(devkafka.Config{Partitions: 1})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	addr := startOutbox(t, db, "relay", "--brokers", broker.Addr(), "--http", "127.0.0.1:0", "--exactly-once")
	var metrics string
	require.Eventually(t, func() bool {
		metrics = get(t, "http://"+addr+"/metrics")
		return strings.Contains(metrics, `outbox_lane_events_total{event="opened"} 1`)
	}, 60*time.Second, 50*time.Millisecond, "the exactly-once relay never counted its lane opened:\n%s", metrics)
	fams := parseFamilies(metrics)
	checked := 0
	for _, expr := range ruleExprs(t) {
		for _, n := range metricNames(expr) {
			if strings.HasPrefix(n, "outbox_lane_") {
				require.True(t, fams.serves(n), "a rule reads %s, which the --exactly-once relay does not serve", n)
				checked++
			}
		}
	}
	require.Positive(t, checked, "a rule reads the lanes' counters")
}
