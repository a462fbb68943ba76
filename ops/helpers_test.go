package ops_test

import (
	"testing"

	"github.com/pgoutbox/outbox/internal/opstest"
)

// bundle is opstest.Bundle, with this package's own helpers.
type bundle struct{ *opstest.Bundle }

func setup(t *testing.T) *bundle { return &bundle{opstest.Setup(t)} }
