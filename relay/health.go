package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// PublishHealth is a sink's memory of how its publishing goes, for its
// Ready: a publish that ends with an error a retry may fix marks it
// failing, one whose messages all went through (or failed for their own
// fault) clears it. A broker can answer a ping and take no message (full,
// out of memory, refusing a destination for now): /readyz must not pass
// then. The zero value is ready; it is safe for concurrent use.
type PublishHealth struct {
	mu      sync.Mutex
	failing error
	since   time.Time
}

// Note records the outcome of one Publish from its results. An error does
// not count when it is permanent (the message's own fault) or wraps one of
// ignore (a sink's "not sent, behind a failed message of its aggregate",
// which says nothing new). A Publish its caller cut short (ctx done), one
// of no message, and one whose every error is ignored are not noted.
func (h *PublishHealth) Note(ctx context.Context, errs []error, ignore ...error) {
	if ctx.Err() != nil || len(errs) == 0 {
		return
	}
	var transient error
	settled := false // a message acknowledged, or refused for its own fault
	for _, err := range errs {
		switch {
		case err == nil || IsPermanent(err):
			settled = true
		case !isAny(err, ignore):
			transient = err
		}
		if transient != nil {
			break
		}
	}
	if transient == nil && !settled {
		return // every message waited behind another: nothing learnt
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case transient == nil:
		h.failing = nil
	case h.failing == nil:
		h.failing, h.since = transient, time.Now()
	default:
		h.failing = transient
	}
}

func isAny(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// Err returns nil unless the last noted publish failed for a reason a
// retry may fix; then an error saying since when, wrapping the latest.
func (h *PublishHealth) Err() error {
	h.mu.Lock()
	failing, since := h.failing, h.since
	h.mu.Unlock()
	if failing == nil {
		return nil
	}
	return fmt.Errorf("publishing has failed since %s (%s): %w", since.UTC().Format(time.RFC3339), time.Since(since).Round(time.Second), failing)
}
