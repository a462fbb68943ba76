package bench

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox/contracts"
)

// benchContracts is the emit scenario's contracts directory: order.placed
// v1, the schema of bigOrder (16 properties, two nested objects through
// $defs, enums, patterns, bounds).
//
//go:embed contracts
var benchContracts embed.FS

// loadBenchContracts compiles benchContracts.
func loadBenchContracts() (*contracts.Set, error) {
	sub, err := fs.Sub(benchContracts, "contracts")
	if err != nil {
		return nil, err
	}
	return contracts.LoadFS(sub)
}

// bigOrder is the ~1 kB payload of the contract variants.
type bigOrder struct {
	OrderID         uuid.UUID   `json:"order_id"`
	CustomerID      string      `json:"customer_id"`
	Status          string      `json:"status"`
	Channel         string      `json:"channel"`
	Currency        string      `json:"currency"`
	TotalCents      int64       `json:"total_cents"`
	TaxCents        int64       `json:"tax_cents"`
	ShippingCents   int64       `json:"shipping_cents"`
	PlacedAt        time.Time   `json:"placed_at"`
	Coupon          *string     `json:"coupon"`
	Email           string      `json:"email"`
	Notes           string      `json:"notes"`
	Tags            []string    `json:"tags"`
	ShippingAddress address     `json:"shipping_address"`
	BillingAddress  address     `json:"billing_address"`
	Items           []namedItem `json:"items"`
}

type address struct {
	Name       string `json:"name"`
	Line1      string `json:"line1"`
	Line2      string `json:"line2,omitempty"`
	City       string `json:"city"`
	PostalCode string `json:"postal_code"`
	Country    string `json:"country"`
}

type namedItem struct {
	SKU        string `json:"sku"`
	Name       string `json:"name"`
	Qty        int    `json:"qty"`
	PriceCents int64  `json:"price_cents"`
}

func newBigOrder(i int, o order) bigOrder {
	addr := address{Name: fmt.Sprintf("Customer %d", i%1000), Line1: fmt.Sprintf("%d Long Example Street", 1+i%200), Line2: "Building B, third floor",
		City: "Amsterdam", PostalCode: "1011 AB", Country: "NL"}
	items := make([]namedItem, 4)
	for k := range items {
		items[k] = namedItem{SKU: fmt.Sprintf("SKU-%d", (i+k)%97), Name: "Stainless steel water bottle, 750 ml", Qty: 1 + (i+k)%5, PriceCents: 1999}
	}
	return bigOrder{
		OrderID: o.OrderID, CustomerID: o.CustomerID, Status: "placed", Channel: []string{"web", "app", "store", "phone"}[i%4],
		Currency: o.Currency, TotalCents: o.TotalCents, TaxCents: o.TotalCents / 5, ShippingCents: 495,
		PlacedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Email: fmt.Sprintf("customer-%d@example.com", i%1000),
		Notes: strings.Repeat("Leave the parcel with the neighbours. ", 3), Tags: []string{"first-order", "newsletter", "gift"},
		ShippingAddress: addr, BillingAddress: addr, Items: items,
	}
}

// checkCost times contracts.Set.Check on n bigOrder payloads, in process,
// and returns the payload's size and the time per check.
func checkCost(set *contracts.Set, n int) (int, time.Duration, error) {
	payloads := make([][]byte, 64)
	for i := range payloads {
		b, err := json.Marshal(newBigOrder(i, newOrder(i)))
		if err != nil {
			return 0, 0, err
		}
		payloads[i] = b
	}
	start := time.Now()
	for i := range n {
		if _, err := set.Check("order.placed", 0, payloads[i%len(payloads)]); err != nil {
			return 0, 0, err
		}
	}
	return len(payloads[0]), time.Since(start) / time.Duration(n), nil
}
