package switchover_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/ops/switchover"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// Moving an outbox from the polling relay to the WAL source, from Go.
// The relayers are yours to stop and start around the call.
func ExamplePrepareSwitchToWAL() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// While the polling relayers run:
	res, err := switchover.PrepareSwitchToWAL(ctx, pool, switchover.SwitchToWALConfig{
		Progress: func(p switchover.DrainProgress) {
			log.Printf("%d rows up to id %d pending, %d held", p.Pending, p.Cut, p.Blocked)
		},
	})
	if err != nil {
		log.Fatal(err) // a held row, say: the error names it; nothing to undo
	}
	log.Printf("slot %s holds every event after %s; the rest is in Kafka", res.Setup.Slot, res.Setup.SlotLSN)
	// Now stop the polling relayers (relay.Relayer.Run's context), then
	// start walrelay.New(...).Run, in that order.
}

// And back, while the WAL relayer runs.
func ExamplePrepareSwitchToPoll() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	res, err := switchover.PrepareSwitchToPoll(ctx, pool, switchover.SwitchToPollConfig{})
	if err != nil {
		log.Fatal(err) // no slot, or no WAL relayer streaming it: nothing was marked
	}
	log.Printf("marked %d rows published before %s", res.Marked, res.Cut)
	// Now stop the WAL relayers; once they are gone, drop the slot and
	// the publication (both named by walrelay.DefaultName by default), then
	// start the polling relayers.
	if err := walrelay.Teardown(ctx, pool, res.Slot, res.Slot); err != nil {
		log.Fatal(err)
	}
}
