package switchover_test

import (
	"testing"

	"github.com/pgoutbox/outbox/internal/opstest"
)

// bundle is opstest.Bundle, with this package's own helpers.
type bundle struct{ *opstest.Bundle }

func TestMain(m *testing.M) { opstest.Main(m) }
