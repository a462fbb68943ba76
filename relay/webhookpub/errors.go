package webhookpub

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/pgoutbox/outbox/relay"
)

// RequestError is an attempt that got no response: the endpoint could
// not be reached, or did not answer in time. A retry may fix it.
type RequestError struct {
	// Endpoint is the URL, without its query.
	Endpoint string
	// Err is the transport's error (a timeout, a refused connection, ...).
	Err error
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("webhook: POST %s: %v", e.Endpoint, e.Err)
}

func (e *RequestError) Unwrap() error { return e.Err }

// StatusError is a response other than 2xx. It is wrapped as permanent
// for the statuses a retry cannot change (see Publisher).
type StatusError struct {
	// Endpoint is the URL, without its query.
	Endpoint string
	// Code is the HTTP status code.
	Code int
	// Body is the start of the response body, as text, for the reason.
	Body string
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("webhook: POST %s: %d %s", e.Endpoint, e.Code, http.StatusText(e.Code))
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}

// bodyPreview is how much of a refusal's body goes into its error.
const bodyPreview = 256

// classify turns a response into nil (2xx), a retriable error with the
// wait the endpoint asked for (408, 429, 5xx; -1 when it asked none), or
// a permanent one.
func classify(resp *http.Response, endpoint string, now time.Time) (time.Duration, error) {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// Drain a little so the connection can be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, 4096)
		return 0, nil
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, bodyPreview))
	err := &StatusError{Endpoint: endpoint, Code: resp.StatusCode, Body: printable(string(raw))}
	switch c := resp.StatusCode; {
	case c == http.StatusRequestTimeout || c == http.StatusTooManyRequests || c >= 500:
		return retryAfter(resp.Header.Get("Retry-After"), now), err
	case c == http.StatusRequestEntityTooLarge:
		return 0, relay.PermanentReason(relay.ReasonTooLarge, fmt.Errorf("%w; raise the endpoint's body limit and retry the row ('outbox events retry'), or park it", err))
	case c == http.StatusUnauthorized || c == http.StatusForbidden:
		return 0, relay.PermanentReason(relay.ReasonNotAuthorized, fmt.Errorf("%w; check that the endpoint holds one of the relay's secrets, then retry the row ('outbox events retry')", err))
	case c >= 300 && c < 400:
		return 0, relay.PermanentReason(relay.ReasonBrokerRefused, fmt.Errorf("%w (to %s); redirects are not followed: point the route at the final URL", err, redact(resp.Header.Get("Location"))))
	}
	return 0, relay.PermanentReason(relay.ReasonBrokerRefused, fmt.Errorf("%w; fix the endpoint or the event, then retry the row ('outbox events retry'), or park it", err))
}

// printable is s on one line, without control characters.
func printable(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return ' '
		}
		return r
	}, s)
	return strings.TrimSpace(s)
}

// maxRetryAfter caps what an endpoint may ask for: beyond the delivery
// timeout the event is handed back to the relayer anyway.
const maxRetryAfter = time.Hour

// retryAfter reads a Retry-After value, delay-seconds or an HTTP date,
// or returns -1 when there is none or it cannot be read.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return -1
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return -1
		}
		return min(time.Duration(n)*time.Second, maxRetryAfter)
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now), 0), maxRetryAfter)
	}
	return -1
}

// backoff is the wait before attempt+1: full jitter over a window that
// doubles from lo up to hi.
func backoff(attempt int, lo, hi time.Duration) time.Duration {
	w := lo << min(attempt, 20)
	if w <= 0 || w > hi {
		w = hi
	}
	return lo/2 + rand.N(w-lo/2+1)
}

// Codes ErrorCode gives.
const (
	codeTimeout    = "timeout"
	codeCanceled   = "canceled"
	codeConnection = "connection"
	codeTLS        = "tls"
	codeNotSent    = "not_sent"
	codeOther      = "other"
)

// ErrorCode names a publish error for metrics: "http_<status>" for a
// response, the reason for a held event (too_large, invalid_topic,
// reserved_header), else timeout, canceled, tls (the endpoint's
// certificate was not trusted), connection, not_sent or other.
func (p *Publisher) ErrorCode(err error) string {
	var se *StatusError
	var re *RequestError
	switch {
	case errors.As(err, &se):
		return "http_" + strconv.Itoa(se.Code)
	case relay.IsPermanent(err):
		return relay.ReasonOf(err)
	case errors.Is(err, errNotSent):
		return codeNotSent
	case errors.Is(err, context.DeadlineExceeded):
		return codeTimeout
	case errors.Is(err, context.Canceled):
		return codeCanceled
	case errors.As(err, &re):
		var te interface{ Timeout() bool }
		if errors.As(re.Err, &te) && te.Timeout() {
			return codeTimeout
		}
		if isTLS(re.Err) {
			return codeTLS
		}
		return codeConnection
	}
	return codeOther
}

// isTLS reports whether err is a failed TLS handshake or certificate
// check.
func isTLS(err error) bool {
	var (
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		hostname x509.HostnameError
		verify   *tls.CertificateVerificationError
		alert    tls.AlertError
		header   tls.RecordHeaderError
	)
	return errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &hostname) ||
		errors.As(err, &verify) || errors.As(err, &alert) || errors.As(err, &header)
}
