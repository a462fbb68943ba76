// Package contracts holds an outbox's event contracts: a JSON Schema per
// event type and version, kept as files in the application's repository
// and read by the producer (outbox.Config.Contracts), the relay, the
// consumer and the CLI (`--contracts DIR`).
//
// A contracts directory has one folder per event type, named exactly as
// the type, holding one schema per version:
//
//	contracts/
//	  contracts.json            optional: defaults for every type
//	  order.placed/
//	    contract.json           optional: this type's settings
//	    v1.schema.json
//	    v2.schema.json
//
// A version's file is v<N>.schema.json, N a positive decimal number with
// no leading zero; versions need not be contiguous (a retired version's
// file may be removed), and the highest is the type's latest. A schema is
// JSON Schema, draft 2020-12 unless its $schema names another draft; it may
// $ref another file of the directory by its path relative to the file
// ("../money.schema.json"), never a remote URL. Files whose names start with
// '.' or '_' and folders that hold no v<N>.schema.json are not types: keep
// shared definitions in a "_defs" folder, say.
//
// contracts.json and contract.json are JSON objects:
//
//	{"compatibility": "FORWARD_TRANSITIVE", "require": false}
//
// compatibility is the mode `outbox contracts check` enforces between a
// type's versions: NONE, BACKWARD, BACKWARD_TRANSITIVE, FORWARD,
// FORWARD_TRANSITIVE, FULL or FULL_TRANSITIVE, with the meanings of the
// Confluent schema registry (FORWARD: a consumer using the previous
// version reads events written with the new one). It defaults to
// FORWARD_TRANSITIVE: every consumer written against an earlier version
// reads the events of the new one.
// require (top level only) makes a type without a contract an error
// (ErrNoContract) where it would otherwise pass unchecked.
//
// The smallest use, in a producer:
//
//	set, err := contracts.Load("contracts")
//	if err != nil { ... }
//	p, err := outbox.NewProducer(outbox.Config{Contracts: set})
//	// p.Emit refuses a payload that breaks its type's contract with an
//	// error that errors.Is(outbox.ErrContractViolation) and errors.As a
//	// *contracts.Violation naming the JSON pointer and the rule.
package contracts
