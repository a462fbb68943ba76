// Package webhookconsumer receives the events the webhook sink
// (relay/webhookpub) delivers: a Verifier checks each request's Standard
// Webhooks signature (constant-time, timestamp tolerance, several
// signatures during a secret rotation), and ReadEvent reads the outbox
// event it carries.
//
//	secrets, err := webhookconsumer.ParseSecrets(os.Getenv("OUTBOX_WEBHOOK_SECRET"))
//	v, err := webhookconsumer.NewVerifier(webhookconsumer.VerifierConfig{Secrets: secrets})
//	http.HandleFunc("/outbox", func(w http.ResponseWriter, r *http.Request) {
//		body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
//		if err := v.Verify(r.Header, body); err != nil {
//			http.Error(w, err.Error(), http.StatusUnauthorized)
//			return
//		}
//		ev, err := webhookconsumer.ReadEvent(r.Header, body)
//		// dedupe on ev.WebhookID and apply in one transaction, then answer 2xx
//	})
package webhookconsumer
