package asyncapi

import (
	"bytes"
	"encoding/json"
)

// decode reads a JSON document, numbers kept as they are written.
func decode(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}
