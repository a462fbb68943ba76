package routing_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/routing"
)

func TestRedisDestination(t *testing.T) {
	t.Parallel()
	for typ, want := range map[string]string{
		"order.placed":     "order",
		"order":            "order",
		"order.line.added": "order",
		"Zoë.created":      "Zoë",
		"a:b.c":            "a:b",
	} {
		got, err := routing.Redis{}.Destination(typ)
		if err != nil || got != want {
			t.Errorf("Destination(%q) = %q, %v; want %q", typ, got, err, want)
		}
	}
	if got, err := (routing.Redis{TopicPrefix: "prod:"}).Destination("order.placed"); err != nil || got != "prod:order" {
		t.Errorf("with prefix: %q, %v", got, err)
	}
	for typ, want := range map[string]string{
		"":                              "names no stream",
		".placed":                       "names no stream",
		"order placed":                  "no spaces or control characters",
		"order\tx.y":                    "no spaces or control characters",
		strings.Repeat("a", 1025):       "more than 1024",
		string([]byte{0xff, 'a'}) + ".": "not UTF-8",
	} {
		_, err := routing.Redis{}.Destination(typ)
		if !errors.Is(err, outbox.ErrInvalidTopic) || !strings.Contains(err.Error(), want) {
			t.Errorf("Destination(%q) = %v; want ErrInvalidTopic saying %q", typ, err, want)
		}
	}
}

func TestRedisSizeAndLimit(t *testing.T) {
	t.Parallel()
	r := routing.Redis{}
	// event_id(8+19) event_type(10+12) aggregate_id(12+36)
	// content-type(12+16) event_source(12+200) payload(7+2)
	// header:k(8)+v(1)
	const want = 27 + 22 + 48 + 28 + 212 + 9 + 9
	if got := r.Size("order.placed", 2, map[string]string{"k": "v"}); got != want {
		t.Errorf("Size = %d, want %d", got, want)
	}
	if got := r.EntrySize(42, "order.placed", 2, nil, ""); got != want-212-9-17 {
		t.Errorf("EntrySize = %d, want %d", got, want-212-9-17)
	}
	if l := r.Limit(); l.Bytes != routing.DefaultRedisMaxBytes || !strings.Contains(l.Raise, "MaxBytes") {
		t.Errorf("Limit = %+v", l)
	}
	if l := (routing.Redis{MaxBytes: 5000}).Limit(); l.Bytes != 5000 {
		t.Errorf("Limit = %+v", l)
	}
}

func TestRedisValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		r    routing.Redis
		want string
	}{
		{routing.Redis{}, ""},
		{routing.Redis{TopicPrefix: "prod:", MaxBytes: 4096}, ""},
		{routing.Redis{TopicPrefix: "prod "}, "cannot start a stream key"},
		{routing.Redis{MaxBytes: 100}, "MaxBytes is 100"},
		{routing.Redis{MaxBytes: 600 << 20}, "proto-max-bulk-len"},
	} {
		err := c.r.Validate()
		if (c.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: Validate = %v, want %q", c.r, err, c.want)
		}
	}
}
