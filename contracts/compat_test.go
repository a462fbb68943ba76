package contracts_test

import (
	"bytes"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/contracts"
)

// decode reads a schema as Load does (numbers as json.Number).
func decode(t *testing.T, s string) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(s)))
	require.NoError(t, err, s)
	return v
}

// rules are the sorted, deduplicated rule codes of bs in direction d.
func rules(bs []contracts.Break, d contracts.Direction) []string {
	var out []string
	for _, b := range bs {
		if b.Direction == d {
			out = append(out, b.Rule)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

const obj = `"type":"object",`

var compatCases = []struct {
	name          string
	old, new      string
	backward, fwd []string // rule codes; nil: compatible that way
	pointer       string   // when set, every break is there
}{
	{name: "unchanged", old: `{` + obj + `"properties":{"a":{"type":"string"}},"required":["a"]}`, new: `{` + obj + `"properties":{"a":{"type":"string"}},"required":["a"]}`},
	{name: "key order and layout only", old: `{"required":["a"],` + obj + `"properties":{"a":{"type":"string","maxLength":3}}}`, new: "{\n  \"properties\": {\"a\": {\"maxLength\": 3, \"type\": \"string\"}}, " + obj + "\"required\": [\"a\"]\n}"},
	{name: "annotations only", old: `{"type":"string"}`, new: `{"type":"string","title":"t","description":"d","examples":["x"],"$comment":"c","default":"z","deprecated":true}`},
	{name: "number to integer", old: `{` + obj + `"properties":{"total":{"type":"number"}}}`, new: `{` + obj + `"properties":{"total":{"type":"integer"}}}`, backward: []string{"type_narrowed"}, pointer: "/properties/total"},
	{name: "integer to number", old: `{"type":"integer"}`, new: `{"type":"number"}`, fwd: []string{"type_widened"}},
	{name: "string to integer", old: `{"type":"string"}`, new: `{"type":"integer"}`, backward: []string{"type_changed"}, fwd: []string{"type_changed"}},
	{name: "null dropped from a type array", old: `{"type":["string","null"]}`, new: `{"type":"string"}`, backward: []string{"type_narrowed"}},
	{name: "type added where none was", old: `{}`, new: `{"type":"object"}`, backward: []string{"type_narrowed"}},
	{name: "schema true to false", old: `true`, new: `false`, backward: []string{"type_narrowed"}, fwd: nil},
	{name: "optional property added to an open model", old: `{` + obj + `"properties":{"a":{"type":"string"}}}`, new: `{` + obj + `"properties":{"a":{"type":"string"},"b":{"type":"string"}}}`, backward: []string{"property_added_to_open_model"}, pointer: "/properties/b"},
	{name: "property removed from an open model", old: `{` + obj + `"properties":{"a":{"type":"string"},"b":{"type":"string"}}}`, new: `{` + obj + `"properties":{"a":{"type":"string"}}}`, fwd: []string{"property_removed_from_open_model"}, pointer: "/properties/b"},
	{name: "property of any value added to an open model", old: `{` + obj + `"properties":{}}`, new: `{` + obj + `"properties":{"b":{"description":"anything"}}}`},
	{name: "optional property added to a closed model", old: `{` + obj + `"properties":{"a":{"type":"string"}},"additionalProperties":false}`, new: `{` + obj + `"properties":{"a":{"type":"string"},"b":{"type":"string"}},"additionalProperties":false}`, fwd: []string{"property_added_to_closed_model"}, pointer: "/properties/b"},
	{name: "property removed from a closed model", old: `{` + obj + `"properties":{"a":{"type":"string"},"b":{"type":"string"}},"additionalProperties":false}`, new: `{` + obj + `"properties":{"a":{"type":"string"}},"additionalProperties":false}`, backward: []string{"property_removed_from_closed_model"}},
	{name: "renamed in a closed model is removed plus added", old: `{` + obj + `"properties":{"a":{"type":"string"}},"additionalProperties":false}`, new: `{` + obj + `"properties":{"b":{"type":"string"}},"additionalProperties":false}`, backward: []string{"property_removed_from_closed_model"}, fwd: []string{"property_added_to_closed_model"}},
	{name: "renamed in an open model", old: `{` + obj + `"properties":{"a":{"type":"string"}}}`, new: `{` + obj + `"properties":{"b":{"type":"string"}}}`, backward: []string{"property_added_to_open_model"}, fwd: []string{"property_removed_from_open_model"}},
	{name: "open model closed", old: `{` + obj + `"properties":{"a":{"type":"string"}}}`, new: `{` + obj + `"properties":{"a":{"type":"string"}},"additionalProperties":false}`, backward: []string{"open_model_closed"}},
	{name: "closed model opened", old: `{` + obj + `"properties":{"a":{"type":"string"}},"additionalProperties":false}`, new: `{` + obj + `"properties":{"a":{"type":"string"}}}`, fwd: []string{"closed_model_opened"}},
	{name: "property added, covered by a partially open model", old: `{` + obj + `"properties":{"a":{"type":"string"}},"additionalProperties":{"type":"string"}}`, new: `{` + obj + `"properties":{"a":{"type":"string"},"b":{"type":"string"}},"additionalProperties":{"type":"string"}}`},
	{name: "property added, not covered by a partially open model", old: `{` + obj + `"additionalProperties":{"type":"string"}}`, new: `{` + obj + `"properties":{"b":{"type":"integer"}},"additionalProperties":{"type":"string"}}`, backward: []string{"property_added_not_covered"}, fwd: []string{"property_added_not_covered"}},
	{name: "property removed, not covered by a partially open model", old: `{` + obj + `"properties":{"b":{"type":"integer"}},"additionalProperties":{"type":"string"}}`, new: `{` + obj + `"additionalProperties":{"type":"string"}}`, backward: []string{"property_removed_not_covered"}, fwd: []string{"property_removed_not_covered"}},
	{name: "additionalProperties narrowed", old: `{` + obj + `"additionalProperties":{"type":["string","integer"]}}`, new: `{` + obj + `"additionalProperties":{"type":"string"}}`, backward: []string{"additional_properties_narrowed"}},
	{name: "additionalProperties widened", old: `{` + obj + `"additionalProperties":{"type":"string"}}`, new: `{` + obj + `"additionalProperties":{"type":["string","integer"]}}`, fwd: []string{"additional_properties_widened"}},
	{name: "patternProperties added to an open model", old: `{` + obj + `"properties":{}}`, new: `{` + obj + `"patternProperties":{"^x_":{"type":"string"}}}`, backward: []string{"pattern_property_added"}},
	{name: "patternProperties removed from an open model", old: `{` + obj + `"patternProperties":{"^x_":{"type":"string"}}}`, new: `{` + obj + `"properties":{}}`, fwd: []string{"pattern_property_removed"}},
	{name: "patternProperties narrowed", old: `{` + obj + `"patternProperties":{"^x_":{"type":"number"}}}`, new: `{` + obj + `"patternProperties":{"^x_":{"type":"integer"}}}`, backward: []string{"type_narrowed"}, pointer: "/patternProperties/^x_"},
	{name: "required property added", old: `{` + obj + `"properties":{"a":{"type":"string"}}}`, new: `{` + obj + `"properties":{"a":{"type":"string"}},"required":["a"]}`, backward: []string{"required_property_added"}, pointer: "/properties/a"},
	{name: "required property removed", old: `{` + obj + `"properties":{"a":{"type":"string"}},"required":["a"]}`, new: `{` + obj + `"properties":{"a":{"type":"string"}}}`, fwd: []string{"required_property_removed"}},
	{name: "nested property narrowed", old: `{` + obj + `"properties":{"address":{` + obj + `"properties":{"zip":{"type":["string","integer"]}}}}}`, new: `{` + obj + `"properties":{"address":{` + obj + `"properties":{"zip":{"type":"string"}}}}}`, backward: []string{"type_narrowed"}, pointer: "/properties/address/properties/zip"},
	{name: "enum value added", old: `{"type":"string","enum":["a","b"]}`, new: `{"type":"string","enum":["a","b","c"]}`, fwd: []string{"enum_value_added"}},
	{name: "enum value removed", old: `{"enum":["a","b"]}`, new: `{"enum":["a"]}`, backward: []string{"enum_value_removed"}},
	{name: "enum added", old: `{"type":"string"}`, new: `{"type":"string","enum":["a"]}`, backward: []string{"enum_added"}},
	{name: "enum removed", old: `{"type":"string","enum":["a"]}`, new: `{"type":"string"}`, fwd: []string{"enum_removed"}},
	{name: "enum replaced by a range that holds it", old: `{"enum":[1,2]}`, new: `{"type":"integer","minimum":1}`, fwd: []string{"enum_removed"}},
	{name: "enum value outside a new minimum", old: `{"enum":[0,2]}`, new: `{"type":"integer","minimum":1}`, backward: []string{"minimum_tightened"}, fwd: []string{"enum_removed"}},
	{name: "boolean to one value", old: `{"type":"boolean"}`, new: `{"enum":[true]}`, backward: []string{"enum_value_removed"}},
	{name: "boolean to both values", old: `{"type":"boolean"}`, new: `{"enum":[true,false]}`},
	{name: "const changed", old: `{"const":"v1"}`, new: `{"const":"v2"}`, backward: []string{"const_changed"}, fwd: []string{"const_changed"}},
	{name: "const added", old: `{"type":"string"}`, new: `{"const":"v1"}`, backward: []string{"const_added"}},
	{name: "const removed", old: `{"const":"v1"}`, new: `{"type":"string"}`, fwd: []string{"const_removed"}},
	{name: "minimum raised", old: `{"type":"number","minimum":0}`, new: `{"type":"number","minimum":1}`, backward: []string{"minimum_tightened"}},
	{name: "minimum lowered", old: `{"type":"number","minimum":1}`, new: `{"type":"number","minimum":0}`, fwd: []string{"minimum_loosened"}},
	{name: "maximum added", old: `{"type":"number"}`, new: `{"type":"number","maximum":100}`, backward: []string{"maximum_tightened"}},
	{name: "exclusiveMaximum dropped", old: `{"type":"number","exclusiveMaximum":100}`, new: `{"type":"number"}`, fwd: []string{"maximum_loosened"}},
	{name: "integer exclusiveMinimum 0 is minimum 1", old: `{"type":"integer","exclusiveMinimum":0}`, new: `{"type":"integer","minimum":1}`},
	{name: "draft-04 boolean exclusiveMinimum", old: `{"type":"number","minimum":0}`, new: `{"type":"number","minimum":0,"exclusiveMinimum":true}`, backward: []string{"minimum_tightened"}},
	{name: "multipleOf tightened", old: `{"type":"integer","multipleOf":2}`, new: `{"type":"integer","multipleOf":4}`, backward: []string{"multiple_of_tightened"}, fwd: nil},
	{name: "multipleOf loosened", old: `{"type":"integer","multipleOf":4}`, new: `{"type":"integer","multipleOf":2}`, fwd: []string{"multiple_of_loosened"}},
	{name: "multipleOf changed", old: `{"type":"number","multipleOf":2}`, new: `{"type":"number","multipleOf":3}`, backward: []string{"multiple_of_changed"}, fwd: []string{"multiple_of_changed"}},
	{name: "minLength raised", old: `{"type":"string","minLength":1}`, new: `{"type":"string","minLength":2}`, backward: []string{"min_length_tightened"}},
	{name: "minLength dropped", old: `{"type":"string","minLength":1}`, new: `{"type":"string"}`, fwd: []string{"min_length_loosened"}},
	{name: "maxLength raised", old: `{"type":"string","maxLength":10}`, new: `{"type":"string","maxLength":20}`, fwd: []string{"max_length_loosened"}},
	{name: "maxLength added", old: `{"type":"string"}`, new: `{"type":"string","maxLength":20}`, backward: []string{"max_length_tightened"}},
	{name: "length bounds on a number do nothing", old: `{"type":"number"}`, new: `{"type":"number","maxLength":2,"minItems":3,"required":["x"]}`},
	{name: "pattern added", old: `{"type":"string"}`, new: `{"type":"string","pattern":"^[A-Z]{3}$"}`, backward: []string{"pattern_added"}},
	{name: "pattern removed", old: `{"type":"string","pattern":"^[A-Z]{3}$"}`, new: `{"type":"string"}`, fwd: []string{"pattern_removed"}},
	{name: "pattern changed", old: `{"type":"string","pattern":"^[A-Z]{3}$"}`, new: `{"type":"string","pattern":"^[A-Z]{2,3}$"}`, backward: []string{"pattern_changed"}, fwd: []string{"pattern_changed"}},
	{name: "format added", old: `{"type":"string"}`, new: `{"type":"string","format":"date-time"}`, backward: []string{"format_added"}},
	{name: "format removed", old: `{"type":"string","format":"date-time"}`, new: `{"type":"string"}`, fwd: []string{"format_removed"}},
	{name: "format changed", old: `{"type":"string","format":"date-time"}`, new: `{"type":"string","format":"date"}`, backward: []string{"format_changed"}, fwd: []string{"format_changed"}},
	{name: "items narrowed", old: `{"type":"array","items":{"type":"number"}}`, new: `{"type":"array","items":{"type":"integer"}}`, backward: []string{"type_narrowed"}, pointer: "/items"},
	{name: "items of objects with a property added to a closed model", old: `{"type":"array","items":{` + obj + `"properties":{"sku":{"type":"string"}},"additionalProperties":false}}`, new: `{"type":"array","items":{` + obj + `"properties":{"sku":{"type":"string"},"qty":{"type":"integer"}},"additionalProperties":false}}`, fwd: []string{"property_added_to_closed_model"}, pointer: "/items/properties/qty"},
	{name: "tuple closed", old: `{"type":"array","prefixItems":[{"type":"string"}]}`, new: `{"type":"array","prefixItems":[{"type":"string"}],"items":false}`, backward: []string{"type_narrowed"}, pointer: "/items"},
	{name: "draft-07 tuple item narrowed", old: `{"type":"array","items":[{"type":"number"}],"additionalItems":false}`, new: `{"type":"array","items":[{"type":"integer"}],"additionalItems":false}`, backward: []string{"type_narrowed"}, pointer: "/items/0"},
	{name: "minItems raised", old: `{"type":"array"}`, new: `{"type":"array","minItems":1}`, backward: []string{"min_items_tightened"}},
	{name: "maxItems raised", old: `{"type":"array","maxItems":5}`, new: `{"type":"array","maxItems":10}`, fwd: []string{"max_items_loosened"}},
	{name: "uniqueItems added", old: `{"type":"array"}`, new: `{"type":"array","uniqueItems":true}`, backward: []string{"unique_items_added"}},
	{name: "uniqueItems removed", old: `{"type":"array","uniqueItems":true}`, new: `{"type":"array"}`, fwd: []string{"unique_items_removed"}},
	{name: "maxProperties added", old: `{"type":"object"}`, new: `{"type":"object","maxProperties":3}`, backward: []string{"max_properties_tightened"}},
	{name: "local $ref target tightened", old: `{"$defs":{"cents":{"type":"integer","minimum":0}},` + obj + `"properties":{"total":{"$ref":"#/$defs/cents"}}}`, new: `{"$defs":{"cents":{"type":"integer","minimum":1}},` + obj + `"properties":{"total":{"$ref":"#/$defs/cents"}}}`, backward: []string{"minimum_tightened"}, pointer: "/properties/total"},
	{name: "draft-07 definitions inlined", old: `{"definitions":{"s":{"type":"string"}},` + obj + `"properties":{"a":{"$ref":"#/definitions/s"}}}`, new: `{` + obj + `"properties":{"a":{"type":"string"}}}`},
	{name: "recursive schema ends", old: `{"$defs":{"n":{` + obj + `"properties":{"kids":{"type":"array","items":{"$ref":"#/$defs/n"}}},"additionalProperties":false}},"$ref":"#/$defs/n"}`, new: `{"$defs":{"n":{` + obj + `"properties":{"kids":{"type":"array","items":{"$ref":"#/$defs/n"}},"name":{"type":"string"}},"additionalProperties":false}},"$ref":"#/$defs/n"}`, fwd: []string{"property_added_to_closed_model"}},
	{name: "recursive schema through anyOf ends", old: `{"$defs":{"n":{"anyOf":[{"type":"null"},{` + obj + `"properties":{"v":{"type":"integer"},"next":{"$ref":"#/$defs/n"}},"additionalProperties":false}]}},"$ref":"#/$defs/n"}`, new: `{"$defs":{"n":{"anyOf":[{"type":"null"},{` + obj + `"properties":{"v":{"type":"number"},"next":{"$ref":"#/$defs/n"}},"additionalProperties":false}]}},"$ref":"#/$defs/n"}`, fwd: []string{"type_widened"}},
	{name: "$ref to another file cannot be read alone", old: `{"$ref":"../_defs/money.json"}`, new: `{"$ref":"../_defs/money.json"}`, backward: []string{"unresolved_ref"}, fwd: []string{"unresolved_ref"}},
	{name: "anyOf branch added", old: `{"anyOf":[{"type":"string"},{"type":"integer"}]}`, new: `{"anyOf":[{"type":"string"},{"type":"integer"},{"type":"null"}]}`, fwd: []string{"any_of_branch_added"}, pointer: "/anyOf/2"},
	{name: "anyOf branch removed", old: `{"anyOf":[{"type":"string"},{"type":"integer"}]}`, new: `{"anyOf":[{"type":"string"}]}`, backward: []string{"any_of_branch_removed"}, pointer: "/anyOf/1"},
	{name: "anyOf branch narrowed in place", old: `{"anyOf":[{"type":"string"},{"type":"number"}]}`, new: `{"anyOf":[{"type":"string"},{"type":"integer"}]}`, backward: []string{"type_narrowed"}, pointer: "/anyOf/1"},
	{name: "oneOf branch added", old: `{"oneOf":[{"type":"string"},{"type":"integer"}]}`, new: `{"oneOf":[{"type":"string"},{"type":"integer"},{"type":"boolean"}]}`, fwd: []string{"one_of_branch_added"}},
	{name: "oneOf branch removed", old: `{"oneOf":[{"type":"string"},{"type":"integer"}]}`, new: `{"oneOf":[{"type":"integer"}]}`, backward: []string{"one_of_branch_removed"}},
	{name: "anyOf added that narrows", old: `{}`, new: `{"anyOf":[{"type":"string"},{"type":"integer"}]}`, backward: []string{"any_of_added"}},
	{name: "type widened into an anyOf", old: `{"type":"string"}`, new: `{"anyOf":[{"type":"string"},{"type":"integer"}]}`, fwd: []string{"type_changed"}, pointer: "/anyOf/1"},
	{name: "allOf gains a required property", old: `{"allOf":[{` + obj + `"properties":{"a":{"type":"string"}}},{"required":["a"]}]}`, new: `{"allOf":[{` + obj + `"properties":{"a":{"type":"string"},"b":{"type":"string"}}},{"required":["a","b"]}]}`, backward: []string{"property_added_to_open_model", "required_property_added"}, pointer: "/properties/b"},
	{name: "allOf flattened into one schema", old: `{"allOf":[{"type":"integer"},{"minimum":0}]}`, new: `{"type":"integer","minimum":0}`},
	{name: "not added", old: `{"type":"string"}`, new: `{"type":"string","not":{"const":""}}`, backward: []string{"unsupported_keyword"}},
	{name: "not removed", old: `{"type":"string","not":{"const":""}}`, new: `{"type":"string"}`, fwd: []string{"unsupported_keyword"}},
	{name: "unknown keyword unchanged beside a compatible change", old: `{` + obj + `"dependentRequired":{"a":["b"]},"maxProperties":3}`, new: `{` + obj + `"dependentRequired":{"a":["b"]},"maxProperties":4}`, fwd: []string{"max_properties_loosened"}},
	{name: "if/then changed", old: `{"if":{"required":["a"]},"then":{"required":["b"]}}`, new: `{"if":{"required":["a"]},"then":{"required":["c"]}}`, backward: []string{"unsupported_keyword"}, fwd: []string{"unsupported_keyword"}},
	{name: "unevaluatedProperties beside a change", old: `{` + obj + `"properties":{"a":{"type":"string"}},"unevaluatedProperties":false}`, new: `{` + obj + `"properties":{"a":{"type":"string"},"b":{"type":"string"}},"unevaluatedProperties":false}`, backward: []string{"property_added_to_open_model", "unsupported_keyword"}, fwd: []string{"unsupported_keyword"}},
	{name: "unevaluatedProperties unchanged", old: `{` + obj + `"properties":{"a":{"type":"string"}},"unevaluatedProperties":false}`, new: `{"properties":{"a":{"type":"string"}},"unevaluatedProperties":false,` + obj + `"title":"x"}`},
	{name: "unevaluatedProperties beside an allOf that changed", old: `{"allOf":[{"properties":{"a":{}}}],"unevaluatedProperties":false}`, new: `{"allOf":[{"properties":{"a":{},"b":{}}}],"unevaluatedProperties":false}`, backward: []string{"unsupported_keyword"}, fwd: []string{"unsupported_keyword"}},
	{name: "a type the checker does not know", old: `{"type":"string"}`, new: `{"type":"text"}`, backward: []string{"unsupported_keyword"}, fwd: []string{"type_widened"}},
}

func TestCompareSchemas(t *testing.T) {
	t.Parallel()
	require.GreaterOrEqual(t, len(compatCases), 40)
	for _, tc := range compatCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			old, new := decode(t, tc.old), decode(t, tc.new)
			full := contracts.CompareSchemas(old, new, contracts.Full)
			require.Equal(t, tc.backward, rules(full, contracts.DirBackward), "backward: %v", full)
			require.Equal(t, tc.fwd, rules(full, contracts.DirForward), "forward: %v", full)
			for _, b := range full {
				require.NotEmpty(t, b.Message)
				if tc.pointer != "" {
					require.Equal(t, tc.pointer, b.Pointer, "%v", b)
				}
			}
			// Each mode reports its own direction only; NONE nothing.
			require.Equal(t, tc.backward, rules(contracts.CompareSchemas(old, new, contracts.Backward), contracts.DirBackward))
			require.Empty(t, rules(contracts.CompareSchemas(old, new, contracts.Backward), contracts.DirForward))
			require.Equal(t, tc.fwd, rules(contracts.CompareSchemas(old, new, contracts.ForwardTransitive), contracts.DirForward))
			require.Empty(t, contracts.CompareSchemas(old, new, contracts.None))
		})
	}
}

// A schema deeper than the checker follows is reported, not passed.
func TestCompareSchemasTooDeep(t *testing.T) {
	t.Parallel()
	nest := func(leaf string) string {
		return strings.Repeat(`{"type":"object","properties":{"a":`, 70) + leaf + strings.Repeat(`}}`, 70)
	}
	bs := contracts.CompareSchemas(decode(t, nest(`{"type":"number"}`)), decode(t, nest(`{"type":"integer"}`)), contracts.Backward)
	require.Equal(t, []string{"schema_too_deep"}, rules(bs, contracts.DirBackward))

	// Unchanged, it holds without going down.
	require.Empty(t, contracts.CompareSchemas(decode(t, nest(`{"type":"number"}`)), decode(t, nest(`{"type":"number"}`)), contracts.Full))
}
