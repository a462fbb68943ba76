package cli

import (
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// The relay's /readyz is not ready while the broker answers but takes no
// records (every produce request fails; metadata requests, and so pings,
// still work), and is ready again once records go through.
func TestReadyzFailsWhileTheBrokerTakesNoRecords(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	broker, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	o := startRelay(t, db, broker, nil, "--http", "127.0.0.1:0", "--cleanup-interval", "0")
	base := "http://" + o.addr.String()
	emit(t, db, uuid.New(), "order.placed", map[string]int{"n": 0})
	require.Eventually(t, func() bool { return count(t, db, "dispatched_at IS NULL") == 0 }, 20*time.Second, 20*time.Millisecond)
	code, body := get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, code, body)

	fault := broker.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: -1})
	emit(t, db, uuid.New(), "order.placed", map[string]int{"n": 1})
	require.Eventually(t, func() bool {
		code, body = get(t, base+"/readyz")
		return code == http.StatusServiceUnavailable
	}, 20*time.Second, 50*time.Millisecond, "/readyz stays ready while no record is taken: %s", body)
	require.Contains(t, body, "broker: not ready: publishing has failed since")
	require.Contains(t, body, "UNKNOWN_SERVER_ERROR")
	require.Equal(t, int64(1), count(t, db, "dispatched_at IS NULL"))

	fault.Remove()
	require.Eventually(t, func() bool { return count(t, db, "dispatched_at IS NULL") == 0 }, 20*time.Second, 20*time.Millisecond)
	code, body = get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "broker: ok")
}
