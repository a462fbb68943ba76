package ops_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
)

// TestConvertProcess is not a test: TestConvertSurvivesKill runs the test
// binary with it as a convert process, which stops at the step
// OUTBOX_MOVE_PAUSE names (printing "paused at <step>") to be killed.
func TestConvertProcess(t *testing.T) {
	url, schema, pause := os.Getenv("OUTBOX_MOVE_URL"), os.Getenv("OUTBOX_MOVE_SCHEMA"), os.Getenv("OUTBOX_MOVE_PAUSE")
	if url == "" {
		t.Skip("the convert process of TestConvertSurvivesKill")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	m, err := migrate.New(outbox.Tables{Schema: schema})
	require.NoError(t, err)
	_, err = m.Convert(ctx, pool, migrate.MoveConfig{Settings: migrate.PartitionSettings{Width: 100_000}, BeforeStep: func(step string) {
		if step == pause {
			fmt.Printf("paused at %s\n", step)
			select {}
		}
	}})
	require.NoError(t, err)
}

// killConvert runs a convert process until it pauses at step, then kills
// it with SIGKILL.
func killConvert(t *testing.T, url, schema, step string) {
	t.Helper()
	cmd := osexec.Command(os.Args[0], "-test.run=^TestConvertProcess$")
	cmd.Env = append(os.Environ(), "OUTBOX_MOVE_URL="+url, "OUTBOX_MOVE_SCHEMA="+schema, "OUTBOX_MOVE_PAUSE="+step)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	paused := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "paused at "+step) {
				paused <- true
				return
			}
		}
		paused <- false
	}()
	select {
	case ok := <-paused:
		require.True(t, ok, "the convert process ended before it reached step %s", step)
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the convert process did not reach step %s", step)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
}

// kill -9 of the convert command at each of its steps, with producers
// writing and a polling relayer running: killed before the bound, before
// the validation, before the swap and inside the swap's transaction (its
// lock held: Postgres rolls it back when the session dies), each rerun
// goes on from where the table stands, and the last finishes. No producer
// fails, every event is published in per-aggregate order.
func TestConvertSurvivesKill(t *testing.T) {
	t.Parallel()
	b := opstest.Setup(t)
	ctx := context.Background()
	m, err := migrate.New(b.DB.Tables)
	require.NoError(t, err)
	r, err := relay.New(b.RelayConfig(t, b.Client(t)))
	require.NoError(t, err)
	opstest.RunRelayer(t, r)
	load := startLoad(t, b.DB, 3, 30)

	steps := map[string]string{}
	for _, step := range []string{migrate.StepBound, migrate.StepValidate, migrate.StepSwap, "swap-locked"} {
		load.waitEmitted(t, 200)
		killConvert(t, b.DB.URL, b.DB.Tables.Schema, step)
		st, found, err := m.ReadMove(ctx, b.DB.Pool)
		require.NoError(t, err)
		if found {
			steps[step] = st.Step
		}
		require.Equal(t, migrate.LayoutPlain, layoutOf(t, m, b.DB), "killed at %s", step)
	}
	require.Equal(t, map[string]string{migrate.StepValidate: migrate.StepValidate, migrate.StepSwap: migrate.StepSwap, "swap-locked": migrate.StepSwap}, steps,
		"the record says where each kill left the move: nothing before the bound, the swap still to do after a kill inside it")

	res, err := m.Convert(ctx, b.DB.Pool, migrate.MoveConfig{Settings: migrate.PartitionSettings{Width: 100_000}})
	require.NoError(t, err)
	require.Equal(t, []string{migrate.StepSwap}, res.Done, "the rerun only swaps")
	require.Equal(t, migrate.LayoutPartitioned, layoutOf(t, m, b.DB))
	load.waitEmitted(t, 200)
	guardHolds(t, b.DB)
	load.stop()
	dups := load.checkPublished(t, b.Broker)
	t.Logf("%d events committed across four kills and the rerun, all published in per-aggregate order; %d redeliveries", load.count(), dups)
}
