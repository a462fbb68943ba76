// Package commithook lets the project's own tests stop a consumer at the
// one moment a crash is hard to arrange from outside: after the database
// transactions that processed some records committed, before their Kafka
// offsets are committed. It travels in the context given to Run, so the
// consumer's public Config has no field for it.
package commithook

import "context"

// Func is called with the offsets about to be committed (topic ->
// partition -> next offset to read), one call at a time. An error stops
// the consumer without committing them; Run returns it.
type Func func(offsets map[string]map[int32]int64) error

type key struct{}

// With returns ctx carrying f.
func With(ctx context.Context, f Func) context.Context {
	return context.WithValue(ctx, key{}, f)
}

// From returns the Func ctx carries, or nil.
func From(ctx context.Context) Func {
	f, _ := ctx.Value(key{}).(Func)
	return f
}
