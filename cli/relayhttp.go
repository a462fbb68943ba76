package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgoutbox/outbox/internal/health"
	"github.com/pgoutbox/outbox/ops/monitor"
)

// The fleet's --http server. With one outbox it serves that outbox's
// monitor (ops/monitor) as `outbox relay` always did: the same metrics,
// unlabelled, and the same /readyz. With several, every metric of an
// outbox carries an outbox label (its name: the cardinality is the
// number of outboxes in the file), the Go and process metrics appear
// once, and /readyz has a line per outbox (?outbox=NAME asks for one).
// Either way /outboxes is a JSON view of each outbox's state.

// handler is the --http server's handler.
func (fl *fleet) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /outboxes", fl.serveOutboxes)
	proc := prometheus.NewRegistry()
	proc.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if !fl.multi {
		r := fl.runs[0]
		starting := health.Handler(promhttp.HandlerFor(proc, promhttp.HandlerOpts{}),
			[]health.Check{{Name: "relay", Check: func(context.Context) error { return r.notRunning() }}}, monitor.DefaultCheckTimeout)
		var mu sync.Mutex
		var served *monitor.Monitor
		var h http.Handler
		mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			mon := r.monitor()
			if mon == nil {
				starting.ServeHTTP(w, req)
				return
			}
			mu.Lock()
			if mon != served {
				served, h = mon, mon.Handler()
			}
			cur := h
			mu.Unlock()
			cur.ServeHTTP(w, req)
		}))
		return mux
	}
	proc.MustRegister(fleetCollector{fl})
	metrics := promhttp.HandlerFor(prometheus.Gatherers{proc, outboxesGatherer{fl.runs}}, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", fl.serveReady)
	return mux
}

// notRunning is nil while the outbox runs, else what it is doing.
func (r *outboxRun) notRunning() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == "running" {
		return nil
	}
	msg := fmt.Sprintf("%s since %s", r.state, r.since.UTC().Format(time.RFC3339))
	if r.lastErr != nil {
		msg += ": " + r.lastErr.Error()
	}
	return fmt.Errorf("%s", msg)
}

// serveReady answers /readyz for several outboxes: a line each, ok while
// it runs, its database answers and its sink can publish (the sink's
// Ready, when it has one); 503 when one is not. Each database is pinged
// once per request, whatever the number of its outboxes.
func (fl *fleet) serveReady(w http.ResponseWriter, req *http.Request) {
	runs := fl.runs
	if name := req.URL.Query().Get("outbox"); name != "" {
		i := slices.IndexFunc(runs, func(r *outboxRun) bool { return r.spec.name == name })
		if i < 0 {
			http.Error(w, fmt.Sprintf("no outbox is named %q; /outboxes lists them", name), http.StatusNotFound)
			return
		}
		runs = runs[i : i+1]
	}
	errs := fl.readiness(req.Context(), runs)
	var b strings.Builder
	ready := true
	for i, r := range runs {
		if errs[i] != nil {
			ready = false
			fmt.Fprintf(&b, "%s: not ready: %s\n", r.spec.name, oneLine(fl.scrub.String(errs[i].Error())))
		} else {
			fmt.Fprintf(&b, "%s: ok\n", r.spec.name)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	fmt.Fprint(w, b.String())
}

// readiness is each of runs' ready, checked at once, each database
// pinged once, whatever the number of its outboxes.
func (fl *fleet) readiness(ctx context.Context, runs []*outboxRun) []error {
	ctx, cancel := context.WithTimeout(ctx, monitor.DefaultCheckTimeout)
	defer cancel()
	pings := map[*fleetPool]func() error{}
	for _, r := range runs {
		if _, ok := pings[r.pool]; !ok {
			p := r.pool.pool
			pings[r.pool] = sync.OnceValue(func() error { return p.Ping(ctx) })
		}
	}
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Go(func() { errs[i] = r.ready(ctx, pings[r.pool]) })
	}
	wg.Wait()
	return errs
}

// ready is nil when the outbox runs, its database answers (ping) and its
// sink can publish.
func (r *outboxRun) ready(ctx context.Context, ping func() error) error {
	if err := r.notRunning(); err != nil {
		return err
	}
	if err := ping(); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	for _, c := range brokerChecks(r.sink.sink) {
		if err := c.Check(ctx); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
	}
	return nil
}

// outboxStatus is one outbox in /outboxes.
type outboxStatus struct {
	Name     string `json:"name"`
	Mode     string `json:"mode"`
	Database string `json:"database"`
	Table    string `json:"table"`
	Sink     string `json:"sink"`
	// State is starting, running, retrying (after a failure, until it
	// starts again) or stopped; Since is when it entered it.
	State string    `json:"state"`
	Since time.Time `json:"since"`
	// Error is the last failure, until the outbox runs again.
	Error string `json:"error,omitempty"`
	// Ready is /readyz's answer for the outbox: it runs, its database
	// answers and its sink can publish; NotReady says why not. A running
	// relayer rides out an outage of its database or broker, retrying:
	// it is running, and not ready.
	Ready    bool   `json:"ready"`
	NotReady string `json:"not_ready,omitempty"`
	Restarts int    `json:"restarts"`
	// Stats are its source's counters since it last started, while it
	// runs.
	Stats *outboxStats `json:"stats,omitempty"`
}

type outboxStats struct {
	Batches           int64 `json:"batches"`
	Dispatched        int64 `json:"dispatched"`
	PermanentFailures int64 `json:"permanent_failures"`
	TransientFailures int64 `json:"transient_failures"`
	FailedBatches     int64 `json:"failed_batches"`
	Parked            int64 `json:"parked,omitempty"`
	Leading           *bool `json:"leading,omitempty"`
}

// serveOutboxes answers /outboxes: each outbox's state and counters.
func (fl *fleet) serveOutboxes(w http.ResponseWriter, req *http.Request) {
	out := make([]outboxStatus, 0, len(fl.runs))
	for i, err := range fl.readiness(req.Context(), fl.runs) {
		st := fl.runs[i].status(fl.scrub)
		if st.Ready = err == nil; err != nil {
			st.NotReady = oneLine(fl.scrub.String(err.Error()))
		}
		out = append(out, st)
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

func (r *outboxRun) status(scrub scrubber) outboxStatus {
	s := r.spec
	cc := r.pool.pool.Config().ConnConfig
	st := outboxStatus{Name: s.name, Mode: s.o.mode, Database: fmt.Sprintf("%s on %s:%d", cc.Database, cc.Host, cc.Port),
		Table: s.tables.OutboxIdent(), Sink: scrub.String(s.sinkWhat())}
	r.mu.Lock()
	defer r.mu.Unlock()
	st.State, st.Since, st.Restarts = r.state, r.since.UTC(), r.restarts
	if r.lastErr != nil {
		st.Error = scrub.String(oneLine(r.lastErr.Error()))
	}
	if r.src != nil {
		rs := r.src.Stats()
		st.Stats = &outboxStats{Batches: rs.Batches, Dispatched: rs.Dispatched, PermanentFailures: rs.PermanentFailures,
			TransientFailures: rs.TransientFailures, FailedBatches: rs.FailedBatches, Parked: rs.Parked}
		if s.o.mode == "wal" {
			st.Stats.Leading = &rs.Leading
		}
	}
	return st
}

// outboxesGatherer gathers the metrics of every running outbox's
// monitor, each labelled with the outbox's name. The Go and process
// metrics, which every monitor's registry has, are left out: the
// process's own registry has them once. A family that the polling and
// the WAL sources both have (outbox_events_dispatched_total, ...) keeps
// the help of the first outbox that has it, so that it is one family.
type outboxesGatherer struct{ runs []*outboxRun }

func (og outboxesGatherer) Gather() ([]*dto.MetricFamily, error) {
	help := map[string]string{}
	var out []*dto.MetricFamily
	var errs prometheus.MultiError
	for _, r := range og.runs {
		mon := r.monitor()
		if mon == nil {
			continue
		}
		mfs, err := mon.Registry().Gather()
		if err != nil {
			errs = append(errs, fmt.Errorf("outbox %s: %w", r.spec.name, err))
		}
		for _, mf := range mfs {
			name := mf.GetName()
			if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
				continue
			}
			if h, ok := help[name]; ok {
				mf.Help = &h
			} else {
				help[name] = mf.GetHelp()
			}
			for _, m := range mf.Metric {
				m.Label = withLabel(m.Label, outboxLabel, r.spec.name)
			}
			out = append(out, mf)
		}
	}
	return out, errs.MaybeUnwrap()
}

// outboxLabel names the outbox of a metric when a process relays several.
const outboxLabel = "outbox"

// withLabel adds name=value to labels, kept sorted by name.
func withLabel(labels []*dto.LabelPair, name, value string) []*dto.LabelPair {
	i, _ := slices.BinarySearchFunc(labels, name, func(l *dto.LabelPair, n string) int { return strings.Compare(l.GetName(), n) })
	return slices.Insert(labels, i, &dto.LabelPair{Name: &name, Value: &value})
}

// fleetCollector exports what only the fleet knows of each outbox:
// whether its relayer runs, and how often it was restarted after a
// failure; an outbox that never started has no other metric.
type fleetCollector struct{ fl *fleet }

var (
	runningDesc = prometheus.NewDesc("outbox_relay_running",
		"1 while the outbox's relayer runs; 0 while it starts, or waits to start again after a failure (see /outboxes for the error).", []string{outboxLabel}, nil)
	restartsDesc = prometheus.NewDesc("outbox_relay_restarts_total",
		"Times the outbox's relayer stopped on an error and was started again, the other outboxes going on.", []string{outboxLabel}, nil)
)

func (c fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- runningDesc
	ch <- restartsDesc
}

func (c fleetCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.fl.runs {
		r.mu.Lock()
		running, restarts := 0.0, float64(r.restarts)
		if r.state == "running" {
			running = 1
		}
		r.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(runningDesc, prometheus.GaugeValue, running, r.spec.name)
		ch <- prometheus.MustNewConstMetric(restartsDesc, prometheus.CounterValue, restarts, r.spec.name)
	}
}
