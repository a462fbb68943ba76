package webhookconsumer_test

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/pgoutbox/outbox/consumer/webhookconsumer"
)

// A Verifier checks a request's Standard Webhooks headers against the
// relay's secret; here a request signed by the npm standardwebhooks
// library (new Webhook(secret).sign("msg_1", date, body)) is checked at
// the time it was made.
func ExampleVerifier() {
	secrets, err := webhookconsumer.ParseSecrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		panic(err)
	}
	signedAt := time.Unix(1_700_000_000, 0)
	v, err := webhookconsumer.NewVerifier(webhookconsumer.VerifierConfig{Secrets: secrets, Now: func() time.Time { return signedAt }})
	if err != nil {
		panic(err)
	}
	h := http.Header{}
	h.Set("webhook-id", "msg_1")
	h.Set("webhook-timestamp", strconv.FormatInt(signedAt.Unix(), 10))
	h.Set("webhook-signature", "v1,LCFy8pwwD15TyTrDaq51mIYQbZr35DUV7v1ZOMOhpyE=")
	fmt.Println(v.Verify(h, []byte(`{"total": 10}`)))
	fmt.Println(v.Verify(h, []byte(`{"total": 99}`)))
	// Output:
	// <nil>
	// no v1 signature in webhook-signature matches any secret
}
