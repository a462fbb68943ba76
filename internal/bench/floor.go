package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/kafka"
)

// The floor reader is the cheapest relay of the WAL this machine can run,
// measured beside pg_recvlogical in the steady scenario: it reads the
// slot with pgconn's replication protocol and produces each transaction's
// inserts to the broker with franz-go, waiting for the acknowledgement
// before it reads on (with the relay's default linger, 2 ms, so that one
// produce request carries the transactions one read took in), on one
// thread (GOMAXPROCS=1), and does nothing
// else: no per-aggregate order under failure, no holds or parking, no
// metrics, no linger, no retries (an error ends it). It is a yardstick,
// not a mode of the relay: what it costs per event is what any relay that
// waits for a broker's acknowledgement pays here, whatever its code.

// FloorReaderConfig is what the floor reader reads and where it produces.
type FloorReaderConfig struct {
	// DatabaseURL connects to the server holding the slot (a role with
	// REPLICATION).
	DatabaseURL string
	// Slot and Publication are the outbox's (pgoutput), set up beforehand.
	Slot, Publication string
	// TopicPrefix is prepended to the topic of each event (the type up to
	// its first '.').
	TopicPrefix string
	// Kafka is the broker.
	Kafka kafka.ClientConfig
	// Linger is how long after a read that took in everything the server
	// had sent the next read waits, as the relay's --linger: the
	// transactions committed meanwhile then go out in one produce
	// request. 0 produces each transaction as it is read.
	Linger time.Duration
}

// floorStatusInterval is how often the floor reader tells the server the
// acknowledged position unasked: pg_recvlogical's --status-interval 1.
const floorStatusInterval = time.Second

// RunFloorReader runs the floor reader until ctx ends (then it returns
// nil) or something fails.
func RunFloorReader(ctx context.Context, c FloorReaderConfig) error {
	runtime.GOMAXPROCS(1)
	opts, err := c.Kafka.Options()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(kafka.ProducerOptions(), opts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	pc, err := pgconn.ParseConfig(c.DatabaseURL)
	if err != nil {
		return err
	}
	pc.RuntimeParams["replication"] = "database"
	pc.RuntimeParams["application_name"] = "outbox_bench_floor"
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("floor reader: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // ending anyway
	err = pglogrepl.StartReplication(ctx, conn, c.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + c.Publication + "'", "messages 'true'"},
	})
	if err != nil {
		return fmt.Errorf("floor reader: start replication: %w", err)
	}
	// The reads take no context (a context per read costs a goroutine);
	// the end of ctx closes the socket under them.
	defer context.AfterFunc(ctx, func() { _ = conn.Conn().Close() })()
	f := &floorReader{cfg: c, conn: conn, cl: cl, rels: map[uint32]floorRelation{}, lastStatus: time.Now()}
	err = f.loop(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// floorRelation is where an outbox relation's columns are.
type floorRelation struct{ id, agg, typ, payload int }

type floorReader struct {
	cfg  FloorReaderConfig
	conn *pgconn.PgConn
	cl   *kgo.Client
	rels map[uint32]floorRelation
	// recs are the records read, of which the first ready belong to
	// committed transactions, the last of which ends at end.
	recs       []*kgo.Record
	ready      int
	end        pglogrepl.LSN
	acked      pglogrepl.LSN
	lastStatus time.Time
}

func (f *floorReader) loop(ctx context.Context) error {
	var read time.Time
	for {
		if f.conn.Frontend().ReadBufferLen() == 0 {
			// Everything read is handled: produce what committed, then
			// linger before the next read.
			if err := f.produce(ctx); err != nil {
				return err
			}
			if d := f.cfg.Linger - time.Since(read); f.cfg.Linger > 0 && d > 0 {
				time.Sleep(d)
			}
			read = time.Now()
		}
		raw, err := f.conn.ReceiveMessage(context.Background())
		if err != nil {
			return fmt.Errorf("floor reader: receive: %w", err)
		}
		cd, ok := raw.(*pgproto3.CopyData)
		if !ok {
			if e, ok := raw.(*pgproto3.ErrorResponse); ok {
				return pgconn.ErrorResponseToPgError(e)
			}
			continue
		}
		reply := false
		switch {
		case len(cd.Data) == 0:
		case cd.Data[0] == pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return err
			}
			reply = ka.ReplyRequested
		case cd.Data[0] == pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return err
			}
			if err := f.apply(ctx, xld.WALData); err != nil {
				return err
			}
		}
		if reply || time.Since(f.lastStatus) >= floorStatusInterval {
			f.lastStatus = time.Now()
			err := pglogrepl.SendStandbyStatusUpdate(context.Background(), f.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: f.acked})
			if err != nil {
				return fmt.Errorf("floor reader: status update: %w", err)
			}
		}
	}
}

// apply takes in one pgoutput message: an insert becomes a record, a
// commit produces the transaction's records and waits for the broker.
func (f *floorReader) apply(ctx context.Context, data []byte) error {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("floor reader: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		r := floorRelation{id: -1, agg: -1, typ: -1, payload: -1}
		for i, col := range m.Columns {
			switch col.Name {
			case "id":
				r.id = i
			case "aggregate_id":
				r.agg = i
			case "type":
				r.typ = i
			case "payload":
				r.payload = i
			}
		}
		if r.id < 0 || r.agg < 0 || r.typ < 0 || r.payload < 0 {
			return fmt.Errorf("floor reader: relation %s.%s is not an outbox table", m.Namespace, m.RelationName)
		}
		f.rels[m.RelationID] = r
	case *pglogrepl.InsertMessage:
		r, ok := f.rels[m.RelationID]
		if !ok || m.Tuple == nil || len(m.Tuple.Columns) <= max(r.id, r.agg, r.typ, r.payload) {
			return errors.New("floor reader: an insert of an unknown relation")
		}
		cols := m.Tuple.Columns
		typ := string(cols[r.typ].Data)
		topic, _, _ := strings.Cut(typ, ".")
		id, _ := strconv.ParseInt(string(cols[r.id].Data), 10, 64)
		f.recs = append(f.recs, &kgo.Record{
			Topic: f.cfg.TopicPrefix + topic, Key: cols[r.agg].Data, Value: cols[r.payload].Data,
			Headers: []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: strconv.AppendInt(nil, id, 10)}, {Key: outbox.HeaderEventType, Value: []byte(typ)}},
		})
	case *pglogrepl.CommitMessage:
		f.ready, f.end = len(f.recs), m.TransactionEndLSN
		if f.cfg.Linger <= 0 {
			return f.produce(ctx)
		}
	}
	return nil
}

// produce sends the committed transactions' records in one go and waits
// for the broker's acknowledgement.
func (f *floorReader) produce(ctx context.Context) error {
	if f.ready > 0 {
		if err := f.cl.ProduceSync(ctx, f.recs[:f.ready]...).FirstErr(); err != nil {
			return fmt.Errorf("floor reader: produce: %w", err)
		}
		f.recs = append(f.recs[:0], f.recs[f.ready:]...)
		f.ready = 0
	}
	f.acked = max(f.acked, f.end)
	return nil
}
