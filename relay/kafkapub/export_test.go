package kafkapub

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/relay"
)

// Record is the record the Publisher sends for a message, for the tests of
// its shape.
var Record = func(m relay.Message, source string) *kgo.Record { return record(m, source, nil) }
