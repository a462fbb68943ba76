package walrelay

import (
	"fmt"
	"time"

	"github.com/pgoutbox/outbox/relay"
)

// Defaults of Config's WAL fields, applied by New and used by `outbox relay
// --mode wal`; those of the shared fields are relay.Common's.
const (
	DefaultStatusInterval     = time.Second
	DefaultHeartbeatInterval  = 5 * time.Second
	DefaultLeaderPollInterval = time.Second
	DefaultSlotBusyTimeout    = 10 * time.Second
	DefaultUnknownTopicGrace  = 30 * time.Second
	DefaultLinger             = 2 * time.Millisecond
	// MaxStatusInterval caps StatusInterval: the server's walsender ends a
	// stream that goes wal_sender_timeout (60s by default) without a
	// status update, and the slot's position should not lag the broker
	// by more than a few seconds.
	MaxStatusInterval = 10 * time.Second
	// HeartbeatPrefix is the prefix of the heartbeat messages.
	HeartbeatPrefix = "outbox-heartbeat"
)

// Config configures a Relayer: the fields every source shares
// (relay.Common; Pool and Sink are required) and the WAL source's
// own. Of Common's: the relayer takes its leader lock, heartbeats, parks
// refused events and reads the slot's state through Pool, and opens its
// replication connection with the pool's connection settings (plus
// replication=database): the role needs the REPLICATION attribute.
// BatchSize is the most events one Publish call takes; while a batch is
// out, the stream is read on until this many more wait, or MaxBatchBytes
// (payload and headers as decoded from the WAL). ShutdownTimeout bounds
// how long Run lets the batch in flight finish and be acknowledged to the
// slot; past it the batch is abandoned, to be re-sent by the next leader.
// After BackoffMin and BackoffMax: the backoff doubles over the failures
// in a row and starts over after a success (a lead that moved the slot, a
// try that found the database up and another relayer leading), so that a
// relayer is back within about BackoffMin of an outage's end plus the last
// wait of that outage. Hooks see one batch per Publish call: its
// dispatched events, its permanent failures (parked; BatchResult.Holds,
// Until zero) and transient ones (retried), and TracerProvider gets its
// "send <topic>" spans.
type Config struct {
	relay.Common

	// Slot is the logical replication slot to read. Defaults to
	// DefaultName of the pool's database and Tables. When both Slot and
	// Publication are left to their defaults and this database has the
	// outbox's slot only under the default name of earlier versions, Run
	// fails with ErrLegacySlot naming it (Names resolves it, as the CLI
	// does): a new slot would skip what is pending in the old one.
	Slot string
	// Publication is the publication of the outbox's inserts: Run refuses
	// one that does not publish exactly Tables' outbox (ErrNotThisOutbox).
	// Defaults to DefaultName of the pool's database and Tables.
	Publication string
	// Messages makes the relayer publish the events of producers in
	// outbox.ModeMessage: transactional logical messages with the
	// outbox's prefix (MessagePrefix). Postgres lets PUBLIC execute
	// pg_logical_emit_message, so that any role could write such a
	// message, with any id; with Messages on, Run refuses to start
	// (ErrMessagesOpen) while PUBLIC, or any role but superusers, the
	// relay's and the owner of <outbox>_emit_message, can execute it:
	// revoke it from PUBLIC (SecureMessages does, in its database) and
	// grant producers EXECUTE on EmitMessageFunc, which draws the ids
	// (see the package's Trust). Off, a message
	// with the outbox's prefix is no event: it is dropped, logged and
	// counted (Stats.Dropped). A non-transactional message is never an
	// event, nor is one whose transaction did not commit. Defaults to
	// false.
	Messages bool
	// SkipSetup makes Run use the slot and publication as they are instead
	// of creating them when missing (Setup). Defaults to false.
	SkipSetup bool
	// StatusInterval is the longest the relayer goes without telling the
	// server how far the broker has acknowledged (a standby status update);
	// it also answers at once when the server asks, and tells about 100ms
	// after the broker acknowledged more than the server knows, so that
	// the slot's lag falls to ~0 that soon after a load stops. Defaults to
	// DefaultStatusInterval (1s); at most MaxStatusInterval (10s).
	StatusInterval time.Duration
	// Linger is how long the relayer lets the replication connection fill
	// before it reads again, once a read took in everything the server had
	// sent: on a busy outbox, one read then takes in many transactions,
	// instead of one message each, which saves the relayer CPU per event
	// (CPU the database needs too, on a shared host; BENCHMARKS.md has
	// figures) and makes batches larger. An event waits at most this long for it;
	// the first after a quiet spell is read at once, and a stream that is
	// behind (reading transactions that committed over 100ms ago, by this
	// host's clock) is read without pause. A negative value turns it off,
	// for the lowest latency. Defaults to DefaultLinger (2ms).
	Linger time.Duration
	// HeartbeatInterval is how often the leader writes a non-transactional
	// logical message (prefix HeartbeatPrefix), so that the slot's position
	// advances while the outbox is idle and other tables fill the WAL. A
	// negative value turns it off. Defaults to DefaultHeartbeatInterval
	// (5s).
	HeartbeatInterval time.Duration
	// LeaderPollInterval is how often a relayer that is not the leader
	// tries to take the leader lock: failover happens within about this
	// long after the leader's session ends. Defaults to
	// DefaultLeaderPollInterval (1s).
	LeaderPollInterval time.Duration
	// SlotBusyTimeout is how long a new leader waits for the slot to be
	// released by its previous reader before it gives up: when that
	// reader is a WAL relayer's stream (application_name "outbox-wal
	// stream ...", a leader that died or was cut off and whose walsender
	// the server has not ended yet), it steps down and tries again, for
	// as long as it takes; any other reader fails Run with ErrSlotBusy.
	// Defaults to DefaultSlotBusyTimeout (10s).
	SlotBusyTimeout time.Duration
	// UnknownTopicGrace is how long an event whose topic the broker does
	// not know (UNKNOWN_TOPIC_OR_PARTITION: not created yet, auto-creation
	// off) is retried, holding the stream, before it is parked: creating
	// the topic within it loses nothing. A type that makes no valid topic
	// name is parked at once. Defaults to DefaultUnknownTopicGrace (30s).
	UnknownTopicGrace time.Duration
	// Name tells this relayer's sessions apart in pg_stat_activity
	// (application_name "outbox-wal <name>"). Defaults to "".
	Name string

	defaultNames bool // Slot and Publication were both left empty
}

// WithDefaults returns cfg with its zero fields set to their defaults
// (Common's by relay.Common.WithDefaults), Slot and Publication to
// DefaultNameOf the pool's database and Tables. Negative durations are
// left for Validate to refuse, but for those where a negative value means
// off (Linger, HeartbeatInterval).
func (cfg Config) WithDefaults() Config {
	cfg.Common = cfg.Common.WithDefaults()
	if cfg.Pool != nil {
		cfg.defaultNames = cfg.defaultNames || cfg.Slot == "" && cfg.Publication == ""
		if cfg.Slot == "" {
			cfg.Slot = DefaultNameOf(cfg.Pool, cfg.Tables)
		}
		if cfg.Publication == "" {
			cfg.Publication = DefaultNameOf(cfg.Pool, cfg.Tables)
		}
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.Linger == 0 {
		cfg.Linger = DefaultLinger
	}
	for _, f := range []struct {
		d   *time.Duration
		def time.Duration
	}{
		{&cfg.StatusInterval, DefaultStatusInterval},
		{&cfg.LeaderPollInterval, DefaultLeaderPollInterval},
		{&cfg.SlotBusyTimeout, DefaultSlotBusyTimeout},
		{&cfg.UnknownTopicGrace, DefaultUnknownTopicGrace},
	} {
		if *f.d == 0 {
			*f.d = f.def
		}
	}
	return cfg
}

// Validate reports the first field of cfg (with its defaults applied) the
// relayer cannot run with: Common's (relay.Common.Validate, the same
// message as the polling relay's), then its own.
func (cfg Config) Validate() error {
	if err := cfg.Common.Validate(); err != nil {
		return err
	}
	cfg = cfg.WithDefaults()
	if err := validNames(cfg.Slot, cfg.Publication); err != nil {
		return err
	}
	if cfg.Linger > time.Second {
		return fmt.Errorf("walrelay: Linger is %s; use at most 1s (a few milliseconds is enough to take in many transactions per read), or a negative value to turn it off", cfg.Linger)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"LeaderPollInterval", cfg.LeaderPollInterval},
		{"SlotBusyTimeout", cfg.SlotBusyTimeout},
		{"StatusInterval", cfg.StatusInterval},
		{"UnknownTopicGrace", cfg.UnknownTopicGrace},
	} {
		if f.d < 0 {
			return fmt.Errorf("walrelay: %s is %s; use a positive duration, or 0 for the default", f.name, f.d)
		}
	}
	if cfg.StatusInterval > MaxStatusInterval {
		return fmt.Errorf("walrelay: StatusInterval is %s; use at most %s, or the server may end the stream (wal_sender_timeout) and the slot lags the broker", cfg.StatusInterval, MaxStatusInterval)
	}
	return nil
}
