package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText prints the result as a person reads it: parameters, machine,
// tables, targets and notes.
func (r Result) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "== %s (%s)\n", r.Scenario, r.Elapsed.Round(100*time.Millisecond))
	m := r.Machine
	fmt.Fprintf(tw, "machine\t%d CPUs (GOMAXPROCS %d) %s, load %.2f; Postgres %s; %s; broker: %s\n",
		m.CPUs, m.GOMAXPROCS, m.CPUModel, m.Load1, m.Postgres, m.GoVersion, m.Broker)
	for _, p := range r.Params {
		fmt.Fprintf(tw, "%s\t%s\n", p.Name, p.Value)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range r.Tables {
		fmt.Fprintln(w)
		if err := t.write(w); err != nil {
			return err
		}
	}
	if len(r.Targets) > 0 {
		fmt.Fprintln(w)
		if err := targetTable(r.Targets).write(w); err != nil {
			return err
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	_, err := fmt.Fprintln(w)
	return err
}

// WriteTargets prints every result's targets in one table.
func WriteTargets(w io.Writer, results []Result) error {
	var all []Target
	for _, r := range results {
		all = append(all, r.Targets...)
	}
	if len(all) == 0 {
		return nil
	}
	return targetTable(all).write(w)
}

func targetTable(ts []Target) Table {
	t := Table{Title: "targets vs measured", Columns: []string{"target", "goal", "measured", "met"}}
	for _, x := range ts {
		met := "yes"
		if !x.Met {
			met = "NO"
		}
		t.Rows = append(t.Rows, []string{x.Name, x.Goal, x.Measured, met})
	}
	return t
}

func (t Table) write(w io.Writer) error {
	if t.Title != "" {
		fmt.Fprintf(w, "-- %s\n", t.Title)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(t.Columns, "\t")+"\t")
	for _, row := range t.Rows {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	return tw.Flush()
}

// WriteMarkdown prints the machine, every result's tables and one table of
// all targets as Markdown, for BENCHMARKS.md.
func WriteMarkdown(w io.Writer, results []Result) {
	if len(results) == 0 {
		return
	}
	m := results[0].Machine
	fmt.Fprintf(w, "Machine: %d CPUs (%s), GOMAXPROCS %d, %s; Postgres %s; broker: %s. Load average (1 min) at the start of each scenario:", m.CPUs, m.CPUModel, m.GOMAXPROCS, m.GoVersion, m.Postgres, m.Broker)
	for _, r := range results {
		fmt.Fprintf(w, " %s %.2f", r.Scenario, r.Machine.Load1)
	}
	fmt.Fprint(w, ".\n\n")
	var all []Target
	for _, r := range results {
		all = append(all, r.Targets...)
	}
	if len(all) > 0 {
		targetTable(all).markdown(w)
	}
	for _, r := range results {
		r.WriteMarkdown(w)
	}
}

// WriteMarkdown prints the result's tables as Markdown.
func (r Result) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "### %s (%s)\n\n", r.Scenario, r.Elapsed.Round(time.Second))
	var ps []string
	for _, p := range r.Params {
		ps = append(ps, p.Name+" "+p.Value)
	}
	fmt.Fprintf(w, "Parameters: %s.\n\n", strings.Join(ps, "; "))
	for _, t := range r.Tables {
		t.markdown(w)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w)
	}
}

func (t Table) markdown(w io.Writer) {
	if t.Title != "" {
		fmt.Fprintf(w, "%s:\n\n", t.Title)
	}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(t.Columns, " | "), strings.Repeat("---|", len(t.Columns)))
	for _, row := range t.Rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintln(w)
}

// rate formats a per-second figure with thousands separators.
func rate(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return thousands(int64(math.Round(v)))
}

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func ratio(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + "x"
}

// ms formats a duration in milliseconds, with decimals where they matter.
func ms(d time.Duration) string {
	f := float64(d) / float64(time.Millisecond)
	switch {
	case f < 10:
		return strconv.FormatFloat(f, 'f', 2, 64)
	case f < 100:
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	return strconv.FormatFloat(f, 'f', 0, 64)
}

func mib(bytes int64) string {
	return strconv.FormatFloat(float64(bytes)/(1<<20), 'f', 1, 64) + " MiB"
}

// percentile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func perSecond(n int64, d time.Duration) float64 {
	if d <= 0 {
		return math.NaN()
	}
	return float64(n) / d.Seconds()
}
