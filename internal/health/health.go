// Package health serves the endpoints every outbox process exposes:
// /metrics, /healthz (the process answers) and /readyz (each readiness
// check answers in time). The relay's monitor (ops/monitor) and the
// consumer's metrics (consumer/consumermetrics) serve them alike.
package health

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Check is one readiness condition of /readyz.
type Check struct {
	// Name appears in /readyz's answer, e.g. "broker".
	Name string
	// Check returns nil when ready. It gets a context with the handler's
	// timeout.
	Check func(ctx context.Context) error
}

// Handler serves metrics on /metrics, /healthz, and /readyz over checks,
// each bounded by timeout: 503 with the reasons when one fails.
func Handler(metrics http.Handler, checks []Check, timeout time.Duration) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		errs := make([]error, len(checks))
		var wg sync.WaitGroup
		for i, c := range checks {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(r.Context(), timeout)
				defer cancel()
				errs[i] = c.Check(ctx)
			})
		}
		wg.Wait()
		var b strings.Builder
		ready := true
		for i, c := range checks {
			if errs[i] != nil {
				ready = false
				fmt.Fprintf(&b, "%s: not ready: %s\n", c.Name, strings.Join(strings.Fields(errs[i].Error()), " "))
			} else {
				fmt.Fprintf(&b, "%s: ok\n", c.Name)
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprint(w, b.String())
	})
	return mux
}
