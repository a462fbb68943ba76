package kafkapub

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"time"
	"weak"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox/kafka"
)

// Limit sources, as error messages name them.
const (
	limitFromOverride = "PublisherConfig.MaxMessageBytes"
	limitFromTopic    = "the topic's max.message.bytes"
	limitFromBroker   = "the broker's message.max.bytes"
	limitFromDefault  = "Kafka's default message.max.bytes; the broker's own could not be read"
)

// How long a learnt limit is trusted before it is read again, and how soon
// a failed read is tried again.
const (
	limitTTL      = 5 * time.Minute
	limitRetryTTL = 30 * time.Second
)

// topicLimit is the largest record batch a topic accepts, and where that
// figure came from.
type topicLimit struct {
	bytes int
	from  string
	at    time.Time
	ttl   time.Duration
}

// topicLimits learns each topic's effective max.message.bytes from the
// broker (DescribeConfigs), caches it, and reads it again after limitTTL.
// With an override it asks the broker nothing.
type topicLimits struct {
	adm *kadm.Client
	// shared marks a client from NewSharedPublisherClient, whose
	// Publishers publish one at a time (publishMu).
	shared    bool
	publishMu sync.Mutex
	// partitioned marks a client with partitionHook: Publishers wait for
	// their records to be partitioned before they flush (see produce).
	partitioned bool

	mu sync.Mutex
	// override, when positive, is the limit of every topic (NewPublisher).
	override int
	byTopic  map[string]topicLimit
	broker   topicLimit // the broker-wide message.max.bytes
}

func newTopicLimits() *topicLimits {
	return &topicLimits{byTopic: map[string]topicLimit{}}
}

// bind gives l the client it reads configurations through.
func (l *topicLimits) bind(client *kgo.Client) { l.adm = kadm.NewClient(client) }

// lookup returns the limit of each of topics, reading from the broker those
// not known, or known for too long.
func (l *topicLimits) lookup(ctx context.Context, topics []string) map[string]topicLimit {
	out := make(map[string]topicLimit, len(topics))
	now := time.Now()
	var stale []string
	l.mu.Lock()
	if l.override > 0 {
		for _, t := range topics {
			out[t] = topicLimit{bytes: l.override, from: limitFromOverride}
		}
		l.mu.Unlock()
		return out
	}
	for _, t := range topics {
		if lim, ok := l.byTopic[t]; ok && now.Sub(lim.at) < lim.ttl {
			out[t] = lim
		} else {
			stale = append(stale, t)
		}
	}
	l.mu.Unlock()
	if len(stale) == 0 {
		return out
	}
	fresh := l.describe(ctx, stale)
	l.mu.Lock()
	for t, lim := range fresh {
		l.byTopic[t] = lim
		out[t] = lim
	}
	l.mu.Unlock()
	return out
}

// forget drops what l learnt of topics, so that the next lookup reads them
// again (a recreated topic may have other limits).
func (l *topicLimits) forget(topics []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, t := range topics {
		delete(l.byTopic, t)
	}
}

// describe reads the limits of topics. A topic's own max.message.bytes
// wins when it was set on the topic; otherwise the broker's
// message.max.bytes applies (which is what a real broker reports for such a
// topic anyway; franz-go's kfake reports Kafka's default instead). A topic
// the broker does not know yet (it will be auto-created) gets the broker's
// limit, read again soon (it may be created with a limit of its own).
func (l *topicLimits) describe(ctx context.Context, topics []string) map[string]topicLimit {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	broker := l.brokerLimit(ctx)
	out := make(map[string]topicLimit, len(topics))
	for _, t := range topics {
		out[t] = topicLimit{bytes: broker.bytes, from: broker.from, at: broker.at, ttl: limitRetryTTL}
	}
	rcs, err := l.adm.DescribeTopicConfigs(ctx, topics...)
	if err != nil {
		return out
	}
	now := time.Now()
	for _, rc := range rcs {
		if rc.Err != nil {
			continue
		}
		for _, c := range rc.Configs {
			if c.Key != "max.message.bytes" || c.Value == nil {
				continue
			}
			n, err := strconv.Atoi(*c.Value)
			if err != nil || n <= 0 {
				break
			}
			switch {
			case c.Source == kmsg.ConfigSourceDynamicTopicConfig:
				out[rc.Name] = topicLimit{bytes: n, from: limitFromTopic, at: now, ttl: limitTTL}
			case broker.from == limitFromDefault:
				out[rc.Name] = topicLimit{bytes: n, from: limitFromTopic, at: now, ttl: limitTTL}
			default:
				out[rc.Name] = topicLimit{bytes: broker.bytes, from: broker.from, at: now, ttl: limitTTL}
			}
		}
	}
	return out
}

// brokerLimit is the broker-wide message.max.bytes, cached like a topic's.
func (l *topicLimits) brokerLimit(ctx context.Context) topicLimit {
	l.mu.Lock()
	b := l.broker
	l.mu.Unlock()
	if b.bytes > 0 && time.Since(b.at) < b.ttl {
		return b
	}
	b = topicLimit{bytes: kafka.DefaultMaxMessageBytes, from: limitFromDefault, at: time.Now(), ttl: limitRetryTTL}
	if rcs, err := l.adm.DescribeBrokerConfigs(ctx); err == nil {
	found:
		for _, rc := range rcs {
			for _, c := range rc.Configs {
				if c.Key != "message.max.bytes" || c.Value == nil {
					continue
				}
				if n, err := strconv.Atoi(*c.Value); err == nil && n > 0 {
					b = topicLimit{bytes: n, from: limitFromBroker, at: time.Now(), ttl: limitTTL}
					break found
				}
			}
		}
	}
	l.mu.Lock()
	l.broker = b
	l.mu.Unlock()
	return b
}

// batchMaxBytes is kgo's per-topic batch cap (ProducerBatchMaxBytesFn): the
// topic's limit once a Publisher learnt it, which it does before the first
// record for the topic is produced, else Kafka's default.
func (l *topicLimits) batchMaxBytes(topic string) int32 {
	n := kafka.DefaultMaxMessageBytes
	l.mu.Lock()
	if l.override > 0 {
		n = l.override
	} else if lim, ok := l.byTopic[topic]; ok {
		n = lim.bytes
	}
	l.mu.Unlock()
	return int32(min(max(n, 512), 1<<30)) // the range kgo accepts
}

// clientLimits finds the limits NewPublisherClient made for a client, so
// that NewPublisher, given that client, sizes its batches by the same
// figures. Keyed weakly: an entry goes when its client is collected.
var clientLimits sync.Map // weak.Pointer[kgo.Client] -> *topicLimits

func registerLimits(client *kgo.Client, l *topicLimits) {
	key := weak.Make(client)
	clientLimits.Store(key, l)
	runtime.AddCleanup(client, func(k weak.Pointer[kgo.Client]) { clientLimits.Delete(k) }, key)
}

func limitsOf(client *kgo.Client) (*topicLimits, bool) {
	v, ok := clientLimits.Load(weak.Make(client))
	if !ok {
		return nil, false
	}
	return v.(*topicLimits), true
}
