// Package webhookwire is what the webhook sink (relay/webhookpub) and its
// receiver (consumer/webhookconsumer) agree on: Standard Webhooks
// signatures (webhook-id, webhook-timestamp, webhook-signature, "whsec_"
// secrets) and how an outbox event's headers travel as HTTP headers. It
// links the standard library only, so routing.Webhook can size an event
// with it.
package webhookwire

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The Standard Webhooks headers.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// The outbox's own headers on a webhook request: the wire contract's
// event_id, event_type, aggregate_id and event_source, with the topic the
// event was routed to. Their names use '-' where the contract uses '_':
// proxies such as nginx drop header names with underscores by default.
const (
	HeaderEventID     = "outbox-event-id"
	HeaderEventType   = "outbox-event-type"
	HeaderAggregateID = "outbox-aggregate-id"
	HeaderEventSource = "outbox-event-source"
	HeaderTopic       = "outbox-topic"
)

// SecretPrefix starts a Standard Webhooks secret; base64 of the key follows.
const SecretPrefix = "whsec_"

// MinSecretBytes is the shortest key ParseSecret accepts.
const MinSecretBytes = 16

// Secret is one signing key. Its String and GoString never show the key.
type Secret struct{ key []byte }

// ParseSecret reads a secret written as "whsec_" + base64 of the key (the
// prefix may be left out), as Standard Webhooks libraries print them.
func ParseSecret(s string) (Secret, error) {
	b64 := strings.TrimPrefix(strings.TrimSpace(s), SecretPrefix)
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		key, err = base64.RawStdEncoding.DecodeString(b64)
	}
	if err != nil {
		return Secret{}, errors.New("the secret is not \"whsec_\" followed by standard base64; generate one with: echo whsec_$(head -c 32 /dev/urandom | base64)")
	}
	if len(key) < MinSecretBytes {
		return Secret{}, fmt.Errorf("the secret's key is %d bytes; use at least %d (24 to 64 is usual): echo whsec_$(head -c 32 /dev/urandom | base64)", len(key), MinSecretBytes)
	}
	return Secret{key: key}, nil
}

// ParseSecrets reads one or more secrets separated by white space or
// commas: during a rotation, the new and the old.
func ParseSecrets(s string) ([]Secret, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' })
	if len(fields) == 0 {
		return nil, errors.New("no secret given")
	}
	out := make([]Secret, 0, len(fields))
	for i, f := range fields {
		sec, err := ParseSecret(f)
		if err != nil {
			return nil, fmt.Errorf("secret %d of %d: %w", i+1, len(fields), err)
		}
		out = append(out, sec)
	}
	return out, nil
}

// String hides the key.
func (Secret) String() string { return SecretPrefix + "<redacted>" }

// GoString hides the key from %#v.
func (Secret) GoString() string { return "webhookwire.Secret{<redacted>}" }

func (s Secret) mac(id string, ts int64, body []byte) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write(strconv.AppendInt(nil, ts, 10))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Sign returns the webhook-signature value for a message: one
// "v1,<base64 HMAC-SHA256 of id.ts.body>" per secret, space-separated.
func Sign(secrets []Secret, id string, ts int64, body []byte) string {
	var b strings.Builder
	for i, s := range secrets {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("v1,")
		b.WriteString(base64.StdEncoding.EncodeToString(s.mac(id, ts, body)))
	}
	return b.String()
}

// SignatureLen is the length of one "v1,<base64>" signature.
const SignatureLen = 3 + 44

// Errors Verify returns.
var (
	ErrMissingHeaders = errors.New("webhook-id, webhook-timestamp and webhook-signature are all required")
	ErrBadTimestamp   = errors.New("webhook-timestamp is not a Unix time in seconds")
	ErrTooOld         = errors.New("webhook-timestamp is older than the tolerance")
	ErrTooNew         = errors.New("webhook-timestamp is further in the future than the tolerance")
	ErrNoMatch        = errors.New("no v1 signature in webhook-signature matches any secret")
)

// Verify checks a request's Standard Webhooks headers against secrets:
// the timestamp within tolerance of now (either way), and at least one
// "v1," signature of the space-separated list matching one secret,
// compared in constant time.
func Verify(secrets []Secret, id, ts, sig string, body []byte, now time.Time, tolerance time.Duration) error {
	if id == "" || ts == "" || sig == "" {
		return ErrMissingHeaders
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return ErrBadTimestamp
	}
	at := time.Unix(sec, 0)
	switch {
	case now.Sub(at) > tolerance:
		return ErrTooOld
	case at.Sub(now) > tolerance:
		return ErrTooNew
	}
	macs := make([][]byte, len(secrets))
	for i, s := range secrets {
		macs[i] = s.mac(id, sec, body)
	}
	for _, one := range strings.Fields(sig) {
		version, b64, ok := strings.Cut(one, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			continue
		}
		for _, m := range macs {
			if hmac.Equal(got, m) {
				return nil
			}
		}
	}
	return ErrNoMatch
}

// MessageID is the webhook-id of an event: its event id, qualified by the
// relayer's source when it has one ("billing:42"), so that ids stay unique
// across outboxes. The source is encoded as EncodeValue does.
func MessageID(source string, eventID int64) string {
	id := strconv.FormatInt(eventID, 10)
	if source == "" {
		return id
	}
	return EncodeValue(source) + ":" + id
}
