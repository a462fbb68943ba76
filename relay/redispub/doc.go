// Package redispub is the relayer's Redis Streams sink: a relay.Sink that
// adds each outbox event as an entry to the stream its type routes to
// (routing.Redis: the topic prefix and the type up to its first '.').
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	sink, err := redispub.New(client, redispub.Config{MaxLen: 1_000_000})
//	if err != nil { ... }
//	r, err := relay.New(relay.Config{Common: relay.Common{Pool: pool, Sink: sink}})
//
// Producers set the same routing: outbox.Config{Routing: routing.Redis{}}.
// `outbox relay --sink redis://host:6379/0` opens it from a URL (see
// OpenURL). docs/sinks/redis.md says what an acknowledged entry means for
// durability, and how consumers read the streams.
package redispub
