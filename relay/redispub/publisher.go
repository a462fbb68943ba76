package redispub

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtext"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/routing"
)

// Defaults of Config.
const (
	// DefaultMaxBytes is the largest stream entry the relayer sends:
	// routing.DefaultRedisMaxBytes, the producers' default, so that what
	// Emit accepts the relayer publishes.
	DefaultMaxBytes = routing.DefaultRedisMaxBytes
	// DefaultWaitTimeout bounds how long WAIT waits for replicas.
	DefaultWaitTimeout = time.Second
)

// maxFields bounds the arguments of one entry: Redis's Lua unpacks an
// entry's fields onto a stack of about 8,000 slots.
const maxFields = 7000

// Config configures a Publisher.
type Config struct {
	// Source, when set, goes into every entry's event_source field. Keep it
	// to outbox.MaxSourceLen bytes: Emit sizes events for a source of at
	// most that. Defaults to "" (no field).
	Source string
	// MaxLen, when positive, trims every stream the Publisher adds to to
	// about MaxLen entries (XADD MAXLEN ~ MaxLen: Redis trims whole radix
	// tree nodes, so a stream keeps at least MaxLen and somewhat more). An
	// entry trimmed before a consumer group read it is gone for that
	// group: size MaxLen for the longest lag a consumer may have. Defaults
	// to 0 (no trimming: streams grow until trimmed by someone else).
	MaxLen int64
	// Wait, when positive, makes every publish wait until that many
	// replicas have the entries (WAIT) before it acknowledges them; a
	// publish that reaches fewer within WaitTimeout fails, to be sent
	// again. Defaults to 0 (acknowledged once the primary has them).
	Wait int
	// WaitTimeout bounds each WAIT. Defaults to DefaultWaitTimeout (1s).
	WaitTimeout time.Duration
	// MaxBytes is the largest stream entry (field names and values, see
	// routing.Redis) the Publisher sends; a larger one is held as too
	// large. It must match the producers' routing.Redis.MaxBytes.
	// Defaults to DefaultMaxBytes (1 MiB).
	MaxBytes int
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) WithDefaults() Config {
	if cfg.WaitTimeout == 0 {
		cfg.WaitTimeout = DefaultWaitTimeout
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	return cfg
}

// Validate reports the first field of cfg (with its defaults applied)
// that a Publisher cannot use, saying what to set instead.
func (cfg Config) Validate() error {
	if len(cfg.Source) > outbox.MaxSourceLen || pgtext.Invalid(cfg.Source) != "" {
		return fmt.Errorf("redispub: Source: use at most %d bytes of UTF-8 text without NUL (producers size events for that)", outbox.MaxSourceLen)
	}
	if cfg.MaxLen < 0 {
		return fmt.Errorf("redispub: MaxLen is %d; use a positive number of entries, or 0 for no trimming", cfg.MaxLen)
	}
	if cfg.Wait < 0 {
		return fmt.Errorf("redispub: Wait is %d; use a positive number of replicas, or 0 not to wait", cfg.Wait)
	}
	if cfg.WaitTimeout < 0 {
		return fmt.Errorf("redispub: WaitTimeout is %s; use a positive duration", cfg.WaitTimeout)
	}
	if err := (routing.Redis{MaxBytes: cfg.MaxBytes}).Validate(); err != nil {
		return fmt.Errorf("redispub: %w", err)
	}
	return nil
}

// Publisher is a relay.Sink that adds each message as an entry to the
// Redis stream its topic names (XADD, the entry id chosen by Redis).
//
// An entry's fields are event_id, event_type, aggregate_id, content-type,
// event_source (when Config.Source is set), one field per header of the
// row's own, named routing.RedisHeaderPrefix followed by the header's name
// (sorted by name), and payload, last.
//
// A batch goes in one pipeline of script calls (EVALSHA), each adding
// runs of entries to one stream (a run: an aggregate's consecutive
// messages to that stream). A run stops at the first entry Redis refuses,
// so nothing of an aggregate lands behind a failed entry of it, while the
// other runs of the call go on. An aggregate whose messages go to several
// streams has its later runs sent in a later round trip, once its earlier
// ones are settled. Each script call touches one key.
type Publisher struct {
	client *redis.Client
	cfg    Config
	script *redis.Script

	// health is the last publishes' outcome, for Ready.
	health relay.PublishHealth
}

// New returns a Publisher on client, with cfg's defaults applied; it
// refuses a config Validate refuses.
func New(client *redis.Client, cfg Config) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Publisher{client: client, cfg: cfg, script: redis.NewScript(addScript)}, nil
}

// addScript adds runs of entries to one stream. KEYS[1] is the stream;
// ARGV[1] the MAXLEN to trim to (~), or "" for none; then, per run, its
// entry count, and per entry its argument count n and n arguments (field,
// value, ...). A run stops at its first entry Redis refuses: the entries
// after it are not added, the other runs go on. It returns, per run, how
// many entries it added and the refusal ("" when none).
const addScript = `local out = {}
local i = 2
while i <= #ARGV do
  local entries = tonumber(ARGV[i])
  i = i + 1
  local added, refusal = 0, ''
  for _ = 1, entries do
    local n = tonumber(ARGV[i])
    if refusal == '' then
      local args = {'XADD', KEYS[1]}
      if ARGV[1] ~= '' then
        args[3] = 'MAXLEN'; args[4] = '~'; args[5] = ARGV[1]
      end
      args[#args + 1] = '*'
      for j = i + 1, i + n do args[#args + 1] = ARGV[j] end
      local r = redis.pcall(unpack(args))
      if type(r) == 'table' and r.err then refusal = r.err else added = added + 1 end
    end
    i = i + n + 1
  end
  out[#out + 1] = added
  out[#out + 1] = refusal
end
return out`

// MessagingSystem names Redis in the relayer's publish spans (see
// relay.MessagingSystem).
func (p *Publisher) MessagingSystem() string { return "redis" }

// Ready returns nil when the publisher can publish: its last publish did
// not end in an error a retry may fix, and the server answers PING. A
// server at maxmemory answers PING and refuses every XADD: /readyz must
// not pass then.
func (p *Publisher) Ready(ctx context.Context) error {
	if err := p.health.Err(); err != nil {
		return err
	}
	return p.client.Ping(ctx).Err()
}

// noteOutcome records, for Ready, whether a publish went through: an
// error a retry may fix marks the publisher failing, a publish with every
// sent message acknowledged clears it.
func (p *Publisher) noteOutcome(ctx context.Context, errs []error) {
	p.health.Note(ctx, errs, errNotSent)
}

// Routing is routing.Redis for topicPrefix with the Publisher's MaxBytes:
// producers must set the same routing.
func (p *Publisher) Routing(topicPrefix string) (outbox.Routing, error) {
	r := routing.Redis{TopicPrefix: topicPrefix, MaxBytes: p.cfg.MaxBytes}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}

// run is an aggregate's consecutive messages to one stream (indexes into
// the batch, ascending), added by one script call.
type run struct {
	agg   uuid.UUID
	topic string
	idx   []int
}

// Publish refuses the messages Redis must not get (too large, a reserved
// header), then sends the rest round by round (see Publisher) and returns
// one error per message.
func (p *Publisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := make([]error, len(msgs))
	failed := map[uuid.UUID]bool{}
	send := make([]int, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		if failed[m.AggregateID] {
			errs[i] = errNotSent
			continue
		}
		if err := p.refuse(m); err != nil {
			errs[i] = err
			failed[m.AggregateID] = true
			continue
		}
		send = append(send, i)
	}
	// The messages refused above hold back only those after them, which
	// are not in send; a run that fails holds back its aggregate's later
	// runs.
	failed = map[uuid.UUID]bool{}
	for _, round := range rounds(msgs, send) {
		live := round[:0:0]
		for _, r := range round {
			if failed[r.agg] {
				for _, i := range r.idx {
					errs[i] = errNotSent
				}
				continue
			}
			live = append(live, r)
		}
		p.sendRound(ctx, msgs, live, errs)
		for _, r := range live {
			if errs[r.idx[len(r.idx)-1]] != nil {
				failed[r.agg] = true
			}
		}
	}
	p.noteOutcome(ctx, errs)
	return errs
}

// refuse returns the permanent error of a message Redis must not get.
func (p *Publisher) refuse(m *relay.Message) error {
	if _, ok := m.Headers[outbox.HeaderAggregateID]; ok {
		return relay.PermanentReason(relay.ReasonReservedHeader, fmt.Errorf(
			"the row's headers hold %q, which the Redis sink sets itself (the entry's aggregate id); rename that header in the row and retry it ('outbox events retry'), or park it", outbox.HeaderAggregateID))
	}
	size := (routing.Redis{}).EntrySize(m.ID, m.Type, len(m.Payload), m.Headers, p.cfg.Source)
	if size > p.cfg.MaxBytes {
		return relay.PermanentReason(relay.ReasonTooLarge, fmt.Errorf(
			"the stream entry is %d bytes (payload %d); the limit is %d (MaxBytes, ?max_bytes). Raise it on the relay and the producers, and retry the row ('outbox events retry'), or park it",
			size, len(m.Payload), p.cfg.MaxBytes))
	}
	if 2*(5+len(m.Headers)) > maxFields {
		return relay.PermanentReason(relay.ReasonBrokerRefused, fmt.Errorf(
			"the row has %d headers; a Redis stream entry from the relay takes at most %d; move them into the payload, or park the row", len(m.Headers), maxFields/2-5))
	}
	return nil
}

// rounds groups idx (ascending) into runs, and the runs into the rounds
// Publish sends one after the other: an aggregate's messages stay in one
// run while they go to one stream, and a message to another stream than
// its aggregate's previous one starts a run a round later.
func rounds(msgs []relay.Message, idx []int) [][]*run {
	type last struct {
		r     *run
		round int
	}
	seen := make(map[uuid.UUID]last, len(idx))
	var out [][]*run
	for _, i := range idx {
		m := &msgs[i]
		l, ok := seen[m.AggregateID]
		if ok && l.r.topic == m.Topic {
			l.r.idx = append(l.r.idx, i)
			continue
		}
		round := 0
		if ok {
			round = l.round + 1
		}
		r := &run{agg: m.AggregateID, topic: m.Topic, idx: []int{i}}
		seen[m.AggregateID] = last{r, round}
		if round == len(out) {
			out = append(out, nil)
		}
		out[round] = append(out[round], r)
	}
	return out
}

// callEntries is about how many entries one script call adds: enough to
// spread a call's cost, few enough that Redis, which runs one script at a
// time, is not held for long. A run is never split across calls.
const callEntries = 500

// call is one script call: runs of one stream.
type call struct {
	topic string
	runs  []*run
}

// calls packs runs into script calls, per stream, in order.
func calls(runs []*run) []*call {
	open := map[string]*call{}
	size := map[*call]int{}
	var out []*call
	for _, r := range runs {
		c := open[r.topic]
		if c == nil || size[c] >= callEntries {
			c = &call{topic: r.topic}
			open[r.topic] = c
			out = append(out, c)
		}
		c.runs = append(c.runs, r)
		size[c] += len(r.idx)
	}
	return out
}

// args returns the script's arguments for c.
func (p *Publisher) args(msgs []relay.Message, c *call) []any {
	maxLen := ""
	if p.cfg.MaxLen > 0 {
		maxLen = strconv.FormatInt(p.cfg.MaxLen, 10)
	}
	args := []any{maxLen}
	for _, r := range c.runs {
		args = append(args, len(r.idx))
		for _, i := range r.idx {
			args = append(args, entryFields(&msgs[i], p.cfg.Source)...)
		}
	}
	return args
}

// entryFields is one message's argument count, then its fields and values.
func entryFields(m *relay.Message, source string) []any {
	f := make([]any, 1, 12+2*len(m.Headers))
	f = append(f,
		outbox.HeaderEventID, strconv.FormatInt(m.ID, 10),
		outbox.HeaderEventType, m.Type,
		outbox.HeaderAggregateID, m.AggregateID.String(),
		outbox.HeaderContentType, relay.ContentTypeOf(m))
	if source != "" {
		f = append(f, outbox.HeaderEventSource, source)
	}
	keys := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		f = append(f, routing.RedisHeaderPrefix+k, m.Headers[k])
	}
	f = append(f, routing.RedisPayloadField, m.Payload)
	f[0] = len(f) - 1
	return f
}

// sendRound sends the runs' script calls in one pipeline, with WAIT last
// when Config.Wait asks for replicas, and sets the runs' results in errs.
// A call whose script the server had lost (NOSCRIPT: it restarted) ran
// nothing; it is sent again once, with the script loaded.
func (p *Publisher) sendRound(ctx context.Context, msgs []relay.Message, runs []*run, errs []error) {
	if len(runs) == 0 {
		return
	}
	cs := calls(runs)
	cmds, wait := p.pipeline(ctx, msgs, cs)
	var again []*call
	for k, c := range cs {
		if redis.HasErrorPrefix(cmds[k].Err(), "NOSCRIPT") {
			again = append(again, c)
			continue
		}
		settle(cmds[k], c, errs)
	}
	if len(again) > 0 {
		if err := p.script.Load(ctx, p.client).Err(); err != nil {
			for _, c := range again {
				for _, r := range c.runs {
					failRun(r, errs, retriable("loading the publish script", err))
				}
			}
		} else {
			var wait2 *redis.Cmd
			cmds, wait2 = p.pipeline(ctx, msgs, again)
			for k, c := range again {
				settle(cmds[k], c, errs)
			}
			p.checkWait(wait2, runs, errs)
		}
	}
	p.checkWait(wait, runs, errs)
}

// pipeline sends the script calls (and WAIT) in one round trip.
func (p *Publisher) pipeline(ctx context.Context, msgs []relay.Message, cs []*call) ([]*redis.Cmd, *redis.Cmd) {
	pipe := p.client.Pipeline()
	cmds := make([]*redis.Cmd, len(cs))
	for k, c := range cs {
		cmds[k] = p.script.EvalSha(ctx, pipe, []string{c.topic}, p.args(msgs, c)...)
	}
	var wait *redis.Cmd
	if p.cfg.Wait > 0 {
		wait = pipe.Do(ctx, "WAIT", p.cfg.Wait, p.cfg.WaitTimeout.Milliseconds())
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	return cmds, wait
}

// checkWait fails the acknowledged messages of runs when WAIT reached
// fewer replicas than Config.Wait: they are on the primary, and sending
// them again makes duplicates, not losses.
func (p *Publisher) checkWait(wait *redis.Cmd, runs []*run, errs []error) {
	if wait == nil {
		return
	}
	n, err := wait.Int64()
	if err == nil && n >= int64(p.cfg.Wait) {
		return
	}
	if err == nil {
		err = &serverError{code: codeNotReplicated, msg: fmt.Sprintf("WAIT: %d of %d replicas acknowledged within %s", n, p.cfg.Wait, p.cfg.WaitTimeout)}
	}
	for _, r := range runs {
		for _, i := range r.idx {
			if errs[i] == nil {
				errs[i] = retriable("waiting for replicas", err)
			}
		}
	}
}

// settle sets the errors of c's messages from its script call: per run,
// the entries the script added are acknowledged, the one Redis refused
// gets the refusal, and the ones after it were not sent.
func settle(cmd *redis.Cmd, c *call, errs []error) {
	v, err := cmd.Slice()
	if err == nil && len(v) != 2*len(c.runs) {
		err = retriable("reading the publish script's reply", fmt.Errorf("%d values for %d runs", len(v), len(c.runs)))
	}
	if err != nil {
		for _, r := range c.runs {
			failRun(r, errs, commandError(err))
		}
		return
	}
	for k, r := range c.runs {
		added, ok1 := v[2*k].(int64)
		refusal, ok2 := v[2*k+1].(string)
		if !ok1 || !ok2 || added > int64(len(r.idx)) || (refusal == "" && added != int64(len(r.idx))) {
			failRun(r, errs, retriable("reading the publish script's reply", fmt.Errorf("unexpected reply %v", v[2*k:2*k+2])))
			continue
		}
		for j, i := range r.idx {
			switch {
			case int64(j) < added:
				errs[i] = nil
			case int64(j) == added:
				errs[i] = entryError(refusal, r.topic)
			default:
				errs[i] = errNotSent
			}
		}
	}
}

// failRun gives err to r's first message and marks the others not sent,
// so that a permanent error belongs to one message.
func failRun(r *run, errs []error, err error) {
	for k, i := range r.idx {
		if k == 0 {
			errs[i] = err
		} else {
			errs[i] = errNotSent
		}
	}
}
