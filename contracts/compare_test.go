package contracts_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/contracts"
)

// pairs lists the findings as "from->to rule".
func pairs(rep *contracts.Report, typ string) []string {
	var out []string
	for _, f := range rep.Findings {
		if f.Type == typ {
			out = append(out, fmt.Sprintf("%d->%d %s", f.From, f.To, f.Rule))
		}
	}
	return out
}

func TestCompareTransitive(t *testing.T) {
	t.Parallel()
	// v1 -> v2 breaks (a property added to an open model), v2 -> v3 is
	// compatible, v1 -> v3 breaks: only the transitive mode compares v3
	// with v1.
	versions := map[string]string{
		"t/v1.schema.json": `{"type":"object","properties":{"a":{"type":"string"}}}`,
		"t/v2.schema.json": `{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}}}`,
		"t/v3.schema.json": `{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"number"}}}`,
	}
	for mode, want := range map[contracts.Compatibility][]string{
		contracts.Backward:           {"1->2 property_added_to_open_model"},
		contracts.BackwardTransitive: {"1->2 property_added_to_open_model", "1->3 property_added_to_open_model"},
		contracts.Forward:            {"2->3 type_widened"},
		contracts.ForwardTransitive:  {"2->3 type_widened"},
		contracts.Full:               {"1->2 property_added_to_open_model", "2->3 type_widened"},
		contracts.FullTransitive:     {"1->2 property_added_to_open_model", "2->3 type_widened", "1->3 property_added_to_open_model"},
		contracts.None:               nil,
	} {
		files := map[string]string{"t/contract.json": `{"compatibility":"` + string(mode) + `"}`}
		for k, v := range versions {
			files[k] = v
		}
		set, err := contracts.Load(writeDir(t, files))
		require.NoError(t, err)
		rep := contracts.Compare(nil, set)
		require.Equal(t, want, pairs(rep, "t"), "%s", mode)
		require.Equal(t, len(want) == 0, rep.Compatible())
		require.Equal(t, 1, rep.Types)
		require.Equal(t, 3, rep.Versions)
	}
}

// A chain of compatible steps is compatible end to end: JSON Schema
// containment is transitive and each rule is a containment test, so the
// transitive modes catch what a step-by-step history let through (a
// version added under NONE, or a mode changed later), not a chain of
// passing steps.
func TestCompareChainOfCompatibleSteps(t *testing.T) {
	t.Parallel()
	set, err := contracts.Load(writeDir(t, map[string]string{
		"contracts.json":   `{"compatibility":"BACKWARD_TRANSITIVE"}`,
		"t/v1.schema.json": `{"type":"object","properties":{"n":{"type":"integer","minimum":1,"maximum":5}},"additionalProperties":false}`,
		"t/v2.schema.json": `{"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":5},"s":{"type":"string"}},"additionalProperties":false}`,
		"t/v3.schema.json": `{"type":"object","properties":{"n":{"type":"number","minimum":0},"s":{"type":["string","null"]}}}`,
	}))
	require.NoError(t, err)
	require.Empty(t, contracts.Compare(nil, set).Findings)
}

func TestCompareFollowsRefsAmongFiles(t *testing.T) {
	t.Parallel()
	set, err := contracts.Load(writeDir(t, map[string]string{
		"contracts.json":              `{"compatibility":"BACKWARD"}`,
		"_defs/money.schema.json":     `{"$defs":{"cents":{"type":"integer","minimum":0}}}`,
		"order.placed/v1.schema.json": `{"type":"object","properties":{"total":{"type":"number"}}}`,
		"order.placed/v2.schema.json": `{"type":"object","properties":{"total":{"$ref":"../_defs/money.schema.json#/$defs/cents"}}}`,
	}))
	require.NoError(t, err)
	// The $ref'd definition is read, not reported as unresolved.
	rep := contracts.Compare(nil, set)
	require.Equal(t, []string{"1->2 type_narrowed", "1->2 minimum_tightened"}, pairs(rep, "order.placed"))
	for _, f := range rep.Findings {
		require.Equal(t, "/properties/total", f.Pointer)
		require.Equal(t, contracts.DirBackward, f.Direction)
		require.Equal(t, contracts.SeverityError, f.Severity)
		require.Equal(t, contracts.Backward, f.Mode)
	}
}

func TestCompareAgainstEarlierSet(t *testing.T) {
	t.Parallel()
	earlierFiles := map[string]string{
		"contracts.json":               `{"compatibility":"BACKWARD"}`,
		"_defs/money.schema.json":      `{"type":"integer"}`,
		"order.placed/v1.schema.json":  `{"type":"object","properties":{"id":{"type":"string"}},"additionalProperties":false}`,
		"order.placed/v2.schema.json":  `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string"}},"additionalProperties":false}`,
		"user.created/v1.schema.json":  `{"type":"object","properties":{"credit":{"$ref":"../_defs/money.schema.json"}}}`,
		"payment.taken/v1.schema.json": `{"type":"object"}`,
		"payment.taken/v2.schema.json": `{"type":"object"}`,
		"shipment.sent/v1.schema.json": `{"type":"object"}`,
		"shipment.sent/v2.schema.json": `{"type":"object"}`,
		"refund.issued/v1.schema.json": `{"type":"object"}`,
	}
	currentFiles := map[string]string{
		"contracts.json": `{"compatibility":"BACKWARD"}`,
		// Changed, and a shared file one version $refs.
		"_defs/money.schema.json": `{"type":"integer","minimum":0}`,
		// v1 laid out anew: not a change. v2 changed. v3 new and
		// compatible. The mode changed.
		"order.placed/contract.json":   `{"compatibility":"FULL"}`,
		"order.placed/v1.schema.json":  "{\n  \"additionalProperties\": false,\n  \"properties\": {\"id\": {\"type\": \"string\"}},\n  \"type\": \"object\"\n}\n",
		"order.placed/v2.schema.json":  `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string","maxLength":200}},"additionalProperties":false}`,
		"order.placed/v3.schema.json":  `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string","maxLength":200}},"additionalProperties":false}`,
		"user.created/v1.schema.json":  `{"type":"object","properties":{"credit":{"$ref":"../_defs/money.schema.json"}}}`,
		"payment.taken/v2.schema.json": `{"type":"object"}`,
		"shipment.sent/v1.schema.json": `{"type":"object"}`,
		"new.type/v1.schema.json":      `{"type":"object"}`,
	}
	earlier, err := contracts.Load(writeDir(t, earlierFiles))
	require.NoError(t, err)
	current, err := contracts.Load(writeDir(t, currentFiles))
	require.NoError(t, err)

	rep := contracts.Compare(earlier, current)
	got := map[string][]string{}
	for _, f := range rep.Findings {
		got[f.Type] = append(got[f.Type], fmt.Sprintf("%s %s %d %d", f.Severity, f.Rule, f.From, f.To))
		require.NotEmpty(t, f.Message)
	}
	require.Equal(t, map[string][]string{
		"order.placed": {
			"warning compatibility_changed 0 0",
			"error published_version_changed 2 2",
			// Under FULL, v1's closed model does not read v2's "note".
			"error property_added_to_closed_model 1 2",
		},
		"user.created":  {"error published_version_changed 1 1"},
		"payment.taken": {"warning version_removed 1 1"},
		"shipment.sent": {"error latest_version_removed 2 2"},
		"refund.issued": {"warning type_removed 0 0"},
	}, got)
	require.Equal(t, 4, rep.Errors())
	require.False(t, rep.Compatible())
	require.Equal(t, 5, rep.Types)
	require.Equal(t, 7, rep.Versions)
	for _, f := range rep.Findings {
		if f.Type == "user.created" {
			require.Contains(t, f.Message, "_defs/money.schema.json")
		}
	}

	// With "require": true, a removed type fails Emit: an error.
	currentFiles["contracts.json"] = `{"require":true,"compatibility":"BACKWARD"}`
	current, err = contracts.Load(writeDir(t, currentFiles))
	require.NoError(t, err)
	rep = contracts.Compare(earlier, current)
	var removed []contracts.Finding
	for _, f := range rep.Findings {
		if f.Rule == contracts.RuleTypeRemoved {
			removed = append(removed, f)
		}
	}
	require.Len(t, removed, 1)
	require.Equal(t, contracts.SeverityError, removed[0].Severity)
	require.Contains(t, removed[0].Message, "ErrNoContract")

	// Against itself, nothing.
	same, err := contracts.Load(writeDir(t, earlierFiles))
	require.NoError(t, err)
	rep = contracts.Compare(earlier, same)
	require.Empty(t, rep.Findings)
	require.True(t, rep.Compatible())
}
