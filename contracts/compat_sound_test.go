package contracts_test

import (
	"fmt"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/contracts"
)

// soundPool are schemas whose every pair the checker judges; sampleEvents
// are instances to test its verdicts on with the validator Check uses.
var soundPool = []string{
	`{}`, `{"type":"integer"}`, `{"type":"number"}`, `{"type":"string"}`, `{"type":["string","integer"]}`, `{"type":"null"}`,
	`{"enum":[1,2]}`, `{"type":"integer","minimum":1,"maximum":2}`, `{"type":"integer","minimum":0}`, `{"type":"number","exclusiveMaximum":2}`,
	`{"anyOf":[{"type":"integer"},{"type":"string"}]}`, `{"anyOf":[{"type":"integer","maximum":5},{"type":"integer","minimum":3}]}`,
	`{"oneOf":[{"type":"string"},{"type":"null"}]}`,
	`{"type":"string","pattern":"^a"}`, `{"const":"ab"}`, `{"type":"string","maxLength":2}`, `{"type":"string","minLength":1}`,
	`{"type":"boolean"}`, `{"enum":[true,false]}`, `{"enum":[true]}`, `{"not":{"type":"string"}}`,
	`{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}`,
	`{"type":"object","properties":{"a":{"type":"string"}}}`,
	`{"type":"object","properties":{"a":{"type":"integer"}}}`,
	`{"type":"object","additionalProperties":{"type":"string"}}`,
	`{"type":"object","patternProperties":{"^a":{"type":"string"}},"additionalProperties":false}`,
	`{"type":"object","patternProperties":{"^a":{"type":"string"}}}`,
	`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`,
	`{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":{"type":"string"}}`,
	`{"type":"object","properties":{"b":{"type":"string"}},"additionalProperties":{"type":"string"}}`,
	`{"type":"object","additionalProperties":false}`, `{"type":"object","maxProperties":1}`,
	`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}},"additionalProperties":false}`,
	`{"type":"object","properties":{"a":{"type":"string"}},"patternProperties":{"^b":{"type":"integer"}},"additionalProperties":false}`,
	`{"type":"object","properties":{"a":{"const":"x"}},"required":["a"]}`,
	`{"type":"object","properties":{"a":{"type":"string"}},"unevaluatedProperties":false}`,
	`{"type":"array","items":{"type":"string"}}`, `{"type":"array","prefixItems":[{"type":"string"}],"items":false}`,
	`{"type":"array","prefixItems":[{"type":"string"}]}`, `{"type":"array","maxItems":1}`, `{"type":"array","uniqueItems":true}`,
	`{"type":"integer","multipleOf":2}`, `{"type":"integer","multipleOf":4}`, `{"type":"number","multipleOf":0.5}`,
	`{"allOf":[{"type":"integer"},{"minimum":0}]}`, `{"$defs":{"s":{"type":"string"}},"$ref":"#/$defs/s"}`,
	`{"if":{"type":"string"},"then":{"minLength":2}}`, `true`, `false`,
}

var sampleEvents = []string{
	`null`, `true`, `false`, `0`, `1`, `2`, `3`, `4`, `6`, `-1`, `1.5`, `2.5`, `""`, `"a"`, `"ab"`, `"abc"`, `"b"`,
	`[]`, `["a"]`, `["a","b"]`, `["a","a"]`, `[1]`, `["a",1]`,
	`{}`, `{"a":"x"}`, `{"a":"y"}`, `{"a":1}`, `{"b":"x"}`, `{"b":1}`, `{"a":"x","b":1}`, `{"a":"x","b":"y"}`, `{"ab":"x"}`, `{"ab":1}`, `{"c":null}`,
}

// Whenever the checker says a change is compatible in a direction, no
// sample event tells otherwise: an event the writer accepts, the reader
// accepts.
func TestCompareSchemasIsSound(t *testing.T) {
	t.Parallel()
	docs := make([]any, len(soundPool))
	schemas := make([]*jsonschema.Schema, len(soundPool))
	for i, s := range soundPool {
		docs[i] = decode(t, s)
		c := jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		url := fmt.Sprintf("file:///pool/%d.json", i)
		require.NoError(t, c.AddResource(url, docs[i]))
		sch, err := c.Compile(url)
		require.NoError(t, err, s)
		schemas[i] = sch
	}
	events := make([]any, len(sampleEvents))
	for i, e := range sampleEvents {
		events[i] = decode(t, e)
	}
	proven := 0
	for a := range docs {
		for b := range docs {
			if len(contracts.CompareSchemas(docs[a], docs[b], contracts.Backward)) > 0 {
				continue
			}
			proven++
			for i, ev := range events {
				if schemas[a].Validate(ev) == nil {
					require.NoError(t, schemas[b].Validate(ev), "judged backward compatible, %s -> %s, yet %s is valid under the first only", soundPool[a], soundPool[b], sampleEvents[i])
				}
			}
		}
	}
	t.Logf("%d of %d pairs proven backward compatible", proven, len(docs)*len(docs))
	// It proves more than the equal pairs.
	require.Greater(t, proven, 2*len(docs))
}
