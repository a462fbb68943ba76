package contracts_test

import (
	"bytes"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/pgoutbox/outbox/contracts"
)

func ExampleCompareSchemas() {
	decode := func(s string) any {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(s)))
		if err != nil {
			panic(err)
		}
		return v
	}
	v1 := decode(`{"type":"object","properties":{"total":{"type":"number"}},"additionalProperties":false}`)
	v2 := decode(`{"type":"object","properties":{"total":{"type":"integer"},"note":{"type":"string"}},"additionalProperties":false}`)
	for _, b := range contracts.CompareSchemas(v1, v2, contracts.Full) {
		fmt.Println(b.Direction, b)
	}
	// Output:
	// backward /properties/total: type narrowed from number to integer [type_narrowed]
	// forward /properties/note: property "note" added where the earlier version has additionalProperties: false [property_added_to_closed_model]
}
