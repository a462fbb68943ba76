package cli

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/contracts"
)

// outboxSpec is one outbox a relay process relays: its settings, from
// the command's own flags or from an entry of a config file, checked
// without connecting.
type outboxSpec struct {
	// name names the outbox in logs, metrics (the outbox label) and
	// health: the entry's name, else <schema>.<table>@<database>.
	name   string
	g      *globals
	o      *relayOptions
	flags  *pflag.FlagSet
	tables outbox.Tables
	pool   *pgxpool.Config
	set    *contracts.Set

	// file is the config file the outbox comes from, nil for flags;
	// values are the settings the file and the command line gave it, by
	// key; line and col are its entry's.
	file      *relayFile
	values    map[string]fileValue
	line, col int
}

// flagSpec is the outbox the command's own flags name. It runs a --mode
// wal action (--setup-only, --teardown) instead, returning nil.
func flagSpec(ctx context.Context, g *globals, o *relayOptions, f *pflag.FlagSet) (*outboxSpec, error) {
	o.cleanupBatchFlag = flagAsGiven(f, "cleanup-batch-size", "cleanup-batch")
	s := &outboxSpec{g: g, o: o, flags: f}
	if err := s.checkBasics(); err != nil {
		return nil, err
	}
	if o.mode == "wal" && o.wal.teardown {
		log, err := g.logger()
		if err != nil {
			return nil, err
		}
		return nil, runWALTeardown(ctx, g, o, log)
	}
	if o.mode == "wal" && o.wal.setupOnly {
		return nil, runWALSetupOnly(ctx, g, o)
	}
	if err := s.checkRest(); err != nil {
		return nil, err
	}
	s.name = defaultOutboxName(s.tables, s.pool)
	return s, nil
}

// checkBasics checks the table names, the values the sources would turn
// into defaults, and --mode with its flags.
func (s *outboxSpec) checkBasics() error {
	t, err := s.g.tables()
	if err != nil {
		return err
	}
	s.tables = t
	if err := s.o.check(); err != nil {
		return err
	}
	if err := s.o.checkProcs(); err != nil {
		return err
	}
	return s.o.checkMode()
}

// checkRest checks what else can be checked without connecting: the
// WAL settings, the sink's, CloudEvents', the contracts (it loads them)
// and the database URL.
func (s *outboxSpec) checkRest() error {
	o := s.o
	if o.mode == "wal" {
		if err := o.wal.check(); err != nil {
			return err
		}
	}
	if err := o.checkSink(); err != nil {
		return err
	}
	var err error
	if o.ceCfg, err = o.ce.config(o.pcfg.Source, s.g.databaseURL, s.tables); err != nil {
		return err
	}
	if s.set, err = o.contracts.load(); err != nil {
		return err
	}
	if err := o.checkSinkFlags(s.flags); err != nil {
		return err
	}
	s.pool, err = parsePoolConfig(s.g.databaseURL)
	return err
}

// parsePoolConfig parses a database URL, with an error that says what to
// write.
func parsePoolConfig(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("bad database URL: %s; set --database-url or DATABASE_URL to e.g. postgres://user@localhost:5432/db", redactErr(err))
	}
	return cfg, nil
}

// defaultOutboxName is <schema>.<table>@<database>.
func defaultOutboxName(t outbox.Tables, pc *pgxpool.Config) string {
	db := pc.ConnConfig.Database
	if db == "" {
		db = pc.ConnConfig.User
	}
	return t.Schema + "." + t.Outbox + "@" + db
}

// relayFileKeys are the keys a config file may hold: the flags of the
// relay command c, its own and those it inherits (--log-level), with a
// scratch set of the outbox flags to try values on.
func relayFileKeys(c *cobra.Command) fileKeys {
	var scratch relayOptions
	sg := &globals{}
	fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	scratch.register(fs, sg)
	return fileKeys{
		lookup: func(name string) *pflag.Flag {
			if f := c.Flags().Lookup(name); f != nil {
				return f
			}
			return c.InheritedFlags().Lookup(name)
		},
		check: func(name, value string) error {
			if fs.Lookup(name) == nil {
				return checkProcessValue(name, value)
			}
			return fs.Set(name, value)
		},
		names: func() []string {
			names := []string{keyName, keyOutboxes}
			for _, set := range []*pflag.FlagSet{c.Flags(), c.InheritedFlags()} {
				set.VisitAll(func(f *pflag.Flag) {
					if f.Deprecated == "" && fileKeyScopes[f.Name].scope != scopeNone && !slices.Contains(names, f.Name) {
						names = append(names, f.Name)
					}
				})
			}
			return names
		},
	}
}

// checkProcessValue checks a value of a process-wide key that is no
// outbox flag: the logging flags, checked as the root checks them.
func checkProcessValue(name, value string) error {
	g := globals{stderr: io.Discard, logLevel: "info", logFormat: "text"}
	switch name {
	case "log-level":
		g.logLevel = value
	case "log-format":
		g.logFormat = value
	default:
		return nil
	}
	_, err := g.logger()
	return err
}

// fileSpecs resolves the outboxes of a config file: each entry's values
// over the command line's flags over the file's top level over the
// flags' defaults (and DATABASE_URL, KAFKA_BROKERS, ...). The top level's
// process-wide keys (--http, --log-level, ...) go to the command's own
// flags, unless given on the command line.
func fileSpecs(c *cobra.Command, g *globals, f *relayFile) ([]*outboxSpec, error) {
	for _, v := range f.top {
		if fileKeyScopes[v.key].scope == scopeProcess && !c.Flags().Changed(v.key) {
			if err := c.Flags().Set(v.key, v.value); err != nil {
				return nil, f.atPos(v.line, v.col, "%s: %s", v.key, valueError(v, err))
			}
		}
	}
	entries := f.entries
	if entries == nil {
		entries = []fileEntry{{line: 1, col: 1}}
	}
	var specs []*outboxSpec
	for _, e := range entries {
		s, err := fileSpec(c, g, f, e)
		if err != nil {
			return nil, err
		}
		specs = append(specs, s)
	}
	if err := checkDistinct(specs); err != nil {
		return nil, err
	}
	return specs, nil
}

// fileSpec resolves and checks one entry of f.
func fileSpec(c *cobra.Command, g *globals, f *relayFile, e fileEntry) (*outboxSpec, error) {
	g2 := &globals{stdout: g.stdout, stderr: g.stderr, logLevel: g.logLevel, logFormat: g.logFormat}
	o := &relayOptions{}
	fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.register(fs, g2)
	if !c.Flags().Changed("database-url") {
		g2.databaseURL = g.databaseURL // DATABASE_URL, unless the file says
	}
	s := &outboxSpec{g: g2, o: o, flags: fs, file: f, values: map[string]fileValue{}, line: e.line, col: e.col}
	set := func(v fileValue) {
		if v.key == keyName {
			s.name = v.value
		} else if fs.Lookup(v.key) != nil && fileKeyScopes[v.key].scope == scopeOutbox {
			// Checked when read: the flag takes it.
			_ = fs.Set(v.key, v.value)
			s.values[v.key] = v
		}
	}
	for _, v := range f.top {
		set(v)
	}
	c.Flags().Visit(func(fl *pflag.Flag) {
		if fs.Lookup(fl.Name) != nil && fileKeyScopes[fl.Name].scope == scopeOutbox {
			set(fileValue{key: fl.Name, value: fl.Value.String(), fromCommandLine: true, secretNotDisplay: secretKeys[fl.Name]})
		}
	})
	for _, v := range e.values {
		set(v)
	}
	o.cleanupBatchFlag = flagAsGiven(fs, "cleanup-batch-size", "cleanup-batch")
	s.dropInheritedKafka(e)
	err := s.checkBasics()
	if err == nil {
		err = s.checkRest()
	}
	if err != nil {
		return nil, s.fileError(err)
	}
	if s.name == "" {
		s.name = defaultOutboxName(s.tables, s.pool)
	}
	return s, nil
}

// dropInheritedKafka forgets the Kafka keys the outbox inherits from the
// top level (or the command line) when its entry names a sink of
// another scheme: they are the other outboxes' defaults, not a mistake
// of this one. Given in the entry itself beside such a sink, they stay,
// for checkSinkFlags to refuse.
func (s *outboxSpec) dropInheritedKafka(e fileEntry) {
	if !slices.ContainsFunc(e.values, func(v fileValue) bool { return v.key == "sink" }) || strings.HasPrefix(strings.ToLower(s.o.sinkURL), "kafka:") {
		return
	}
	for _, name := range kafkaOnlyFlags {
		if slices.ContainsFunc(e.values, func(v fileValue) bool { return v.key == name }) {
			continue
		}
		if f := s.flags.Lookup(name); f != nil && f.Changed {
			f.Changed = false
			delete(s.values, name)
		}
	}
}

var flagRef = regexp.MustCompile(`--([a-z][a-z0-9-]*)`)

// fileError is err, found for an outbox of the file, at the position of
// the first key it names (of the outbox's entry, else of its file), in
// the file's words: keys, not --flags.
func (s *outboxSpec) fileError(err error) error {
	msg := err.Error()
	line, col := s.line, s.col
	for _, m := range flagRef.FindAllStringSubmatch(msg, -1) {
		if v, ok := s.values[m[1]]; ok && !v.fromCommandLine {
			line, col = v.line, v.col
			break
		}
	}
	msg = flagRef.ReplaceAllStringFunc(msg, func(ref string) string {
		if name := ref[2:]; s.flags.Lookup(name) != nil {
			if v, ok := s.values[name]; !ok || !v.fromCommandLine {
				return name
			}
		}
		return ref
	})
	what := "outbox"
	if s.name != "" {
		what += " " + s.name
	}
	return fmt.Errorf("%s:%d:%d: %s: %s", s.file.path, line, col, what, msg)
}

// where is the outbox's entry, "file:line" (or its name for flags), for
// errors about two outboxes.
func (s *outboxSpec) where() string {
	if s.file == nil {
		return s.name
	}
	return fmt.Sprintf("%s (line %d)", s.name, s.line)
}

// checkDistinct refuses two outboxes of one name, two of one table in one
// database, and two WAL outboxes of one server naming the same slot
// (slot names are one namespace per server).
func checkDistinct(specs []*outboxSpec) error {
	names := map[string]*outboxSpec{}
	tables := map[string]*outboxSpec{}
	slots := map[string]*outboxSpec{}
	for _, s := range specs {
		cc := s.pool.ConnConfig
		server := fmt.Sprintf("%s:%d", cc.Host, cc.Port)
		if prev, dup := names[s.name]; dup {
			return s.fileError(fmt.Errorf("the name %s is taken by %s; give each outbox its own name", s.name, prev.where()))
		}
		names[s.name] = s
		id := fmt.Sprintf("%s/%s %s", server, cc.Database, s.tables.OutboxIdent())
		if prev, dup := tables[id]; dup {
			return s.fileError(fmt.Errorf("duplicate outbox: %s relays %s of database %s on %s already; remove one entry, or name another table or database", prev.where(), s.tables.OutboxIdent(), cc.Database, server))
		}
		tables[id] = s
		if s.o.mode == "wal" && s.o.wal.slot != "" {
			key := server + " " + s.o.wal.slot
			if prev, dup := slots[key]; dup {
				return s.fileError(fmt.Errorf("--slot %s is taken by %s on the same server (slot names are one namespace per server); give each outbox its own, or leave --slot to its default", s.o.wal.slot, prev.where()))
			}
			slots[key] = s
		}
	}
	return nil
}

// printConfigCheck prints what `outbox relay --config FILE --check` found: each
// outbox's settings as resolved (those the file or the command line set,
// and where it relays from and to), secrets hidden, and what the process
// would share.
func printConfigCheck(g *globals, f *relayFile, specs []*outboxSpec, o *relayOptions) {
	w := g.stdout
	pools, conns := planSharing(specs)
	fmt.Fprintf(w, "%s: %d outbox(es); %d database pool(s), %d shared sink client(s)", f.path, len(specs), len(pools), len(conns))
	if o.ops.httpAddr != "" {
		fmt.Fprintf(w, "; --http %s", o.ops.httpAddr)
	}
	fmt.Fprintln(w)
	for _, s := range specs {
		fmt.Fprintf(w, "\noutbox %s (%s:%d)\n", s.name, f.path, s.line)
		for _, k := range s.shownKeys() {
			fmt.Fprintf(w, "  %s: %s\n", k, s.display(k))
		}
	}
	fmt.Fprintln(w)
	for _, p := range pools {
		fmt.Fprintf(w, "pool %s: up to %d connections for %s\n", redactConnString(p.url), p.maxConns, strings.Join(p.names, ", "))
	}
	for _, c := range conns {
		fmt.Fprintf(w, "sink client %s: shared by %s\n", c.what, strings.Join(c.names, ", "))
	}
}

// shownKeys are the keys --check prints for s: where it relays from and
// to, and every key the file or the command line set.
func (s *outboxSpec) shownKeys() []string {
	keys := []string{"database-url", "schema", "table", "mode"}
	if s.o.sinkURL != "" {
		keys = append(keys, "sink")
	} else {
		keys = append(keys, "brokers")
	}
	var more []string
	for k := range s.values {
		if !slices.Contains(keys, k) {
			more = append(more, k)
		}
	}
	slices.Sort(more)
	return append(keys, more...)
}

// display is key's value for --check: as the file wrote it, or as the
// command line or the default gave it, its secrets hidden.
func (s *outboxSpec) display(key string) string {
	if v, ok := s.values[key]; ok {
		return v.display()
	}
	return fileValue{key: key, value: s.flags.Lookup(key).Value.String(), fromCommandLine: true, secretNotDisplay: secretKeys[key]}.display()
}

// plannedPool is one pool of a relay process: a database connection
// string and the outboxes on it.
type plannedPool struct {
	url      string
	maxConns int32
	names    []string
	specs    []*outboxSpec
}

// plannedConn is a sink client several outboxes share.
type plannedConn struct {
	key, what string
	names     []string
}

// planSharing groups specs by database connection string (one pool each,
// sized for its outboxes) and by sink client (sinkKey; those more than
// one outbox shares).
func planSharing(specs []*outboxSpec) ([]*plannedPool, []*plannedConn) {
	var pools []*plannedPool
	var conns []*plannedConn
	for _, s := range specs {
		i := slices.IndexFunc(pools, func(p *plannedPool) bool { return p.url == s.g.databaseURL })
		if i < 0 {
			pools = append(pools, &plannedPool{url: s.g.databaseURL})
			i = len(pools) - 1
		}
		p := pools[i]
		p.names, p.specs = append(p.names, s.name), append(p.specs, s)
		p.maxConns = poolSize(p.specs)
		key := s.o.sinkKey()
		if key == "" {
			continue
		}
		j := slices.IndexFunc(conns, func(c *plannedConn) bool { return c.key == key })
		if j < 0 {
			conns = append(conns, &plannedConn{key: key, what: s.sinkWhat()})
			j = len(conns) - 1
		}
		conns[j].names = append(conns[j].names, s.name)
	}
	conns = slices.DeleteFunc(conns, func(c *plannedConn) bool { return len(c.names) < 2 })
	return pools, conns
}

// sinkWhat names the outbox's sink for people: its URL, password hidden,
// or Kafka on its brokers.
func (s *outboxSpec) sinkWhat() string {
	if s.o.sinkURL != "" {
		return redactURL(s.o.sinkURL)
	}
	return "kafka on " + s.o.kf.brokers
}

// poolSize is how many connections the pool of specs' database may
// open: one per outbox (a polling outbox's claim, a WAL outbox's
// heartbeats, parking and slot reads; a WAL outbox's leader session and
// stream connect outside the pool), and two more: for the monitor jobs
// (gauges, watchdog, cleanup: short queries, spread over time), and for
// the claim of a busy outbox's next batch while it publishes a full one
// (it waits for a connection while the others use theirs). One polling
// outbox gets 4, as `outbox relay` always gave it. The server holds far
// fewer while the outboxes idle: connections idle for poolIdleTime are
// closed.
func poolSize(specs []*outboxSpec) int32 {
	return max(int32(len(specs))+2, 4)
}

// poolIdleTime is how long a pool's connection may stay idle before it
// is closed (checked every poolCheckPeriod): the burst of the outboxes'
// start, or of a backlog, does not hold connections on the server for
// pgxpool's default half hour. Polls every second keep the connections
// they need in use.
const (
	poolIdleTime    = 30 * time.Second
	poolCheckPeriod = 10 * time.Second
)
