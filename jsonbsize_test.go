package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// jsonbCases are documents whose JSONB text or refusal is easy to get
// wrong; each was checked by hand against Postgres 15 first.
var jsonbCases = []string{
	`{"b":1,"a":2,"a":3}`, `{"a":1,"\u0061":2}`, `{"aa":1,"b":2,"a":3}`,
	`{"a":{"x":[1,2,3,4,5,6,7,8,9]},"a":1}`, `{"a":1,"a":{"x":[1,2,3]}}`,
	`[1,2]`, `{}`, `[]`, ` [ ] `, "\t{ \"a\" :\n[ 1 , { } ] }\r\n",
	`{"a":"\\u0000"}`, `{"a":"\u0000"}`, `"\u0000"`, `"\ud800"`, `"\udc00"`, `"\ud800\udc00"`,
	`"\ud83d\ude00"`, `"\uD800\uDC00"`, `"\uDBFF"`, `"\ud800x"`, `"\ud800\u0041"`, `"\ud800\ud800"`,
	`"\ud800\\"`, `"\udbff\udfff"`, `"\ud800\n"`, `"\udc00\ud800"`, `"\ud800\udc00\udc00"`,
	`"\u00e9\/\b\f\n\r\t\u0001\u001f\u007f"`, `"\u0008\u000c\u000a\u000d\u0009\u0022\u005c\u002f"`,
	`"\u2028 é 😀 <&>"`, `"\u003c\u0026"`,
	`1e3`, `1.5e-3`, `-0.0`, `1E+2`, `15e-1`, `0.10`, `-0`, `0e5`, `1e-5`, `1.00e1`, `-0e-3`, `100e-2`,
	`12345678901234567890.123e-30`, `-1.5E+3`, `0.0001e131075`, `0.0001e131076`, `10e131070`, `10e131071`,
	`1e131071`, `1e131072`, `1e200000`, `1e-16383`, `1e-16384`, `0.1e-16382`, `0.0e-16382`, `0.0e-16383`,
	`-0e-16383`, `0e-20000`, `0e200000`, `0e1073741822`, `0e1073741823`, `0e-1073741822`,
	`0e99999999999999999999`, `1e0000000000000000000000000001`, `1e-0000000000000000000000000001`,
	`true`, `false`, `null`, `[true,false,null]`, `{"t":true,"f":false,"n":null}`,
	strings.Repeat("9", 131072), strings.Repeat("9", 131073), "-" + strings.Repeat("9", 131072),
	"0." + strings.Repeat("0", 16383), "0." + strings.Repeat("0", 16384), "1." + strings.Repeat("5", 16383) + "e1",
	"\"\xff\"", "\"a\xc3\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "{\"\xff\":1}",
	wideObject(40, 7), wideObject(17, 3), wideObject(16, 5),
	// Long runs between escapes, and escaped quotes far from the closing one.
	`"` + strings.Repeat(`abcdefghijklmnopqrstuvwxyz\"\\\n\u00e9\ud83d\ude00`, 50) + `"`,
	`["` + strings.Repeat(`0123456789abcdef\"`, 40) + `x","` + strings.Repeat("y", 100) + `\u0000"]`,
	// Empty keys take no room among the decoded keys, which once misled
	// the tie-break between repeats.
	`{"":{"":[null,["",{"":5,"😀":null,"":"","":0,"a":true,"":0,"":false,"b":false,"":"","":3,"":0,"":null,"b":null,"0":null,"😀":true,"a":0,"3":1}]],"a":2}}`,
}

// wideObject has n members whose keys repeat every `every`, the later
// values longer than the earlier ones.
func wideObject(n, every int) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k` + strconv.Itoa(i%every) + `":"` + strings.Repeat("x", i) + `"`)
	}
	b.WriteByte('}')
	return b.String()
}

// pgJSONBTextLen asks Postgres for the length of doc's JSONB text, or its
// refusal.
func pgJSONBTextLen(t testing.TB, pool *pgxpool.Pool, doc []byte) (int, error) {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), "SELECT octet_length($1::text::jsonb::text)", string(doc)).Scan(&n)
	var pgErr *pgconn.PgError
	if err != nil && !errors.As(err, &pgErr) {
		t.Fatalf("not a refusal from Postgres: %v", err)
	}
	return n, err
}

// checkJSONB compares JSONBTextLen with Postgres on doc: the same length,
// or both refusing.
func checkJSONB(t testing.TB, pool *pgxpool.Pool, doc []byte) {
	t.Helper()
	if !json.Valid(doc) {
		return // Emit refuses it as not JSON before measuring it
	}
	want, pgErr := pgJSONBTextLen(t, pool, doc)
	got, err := outbox.JSONBTextLen(doc)
	show := string(doc)
	if len(show) > 200 {
		show = show[:200] + "... (" + strconv.Itoa(len(doc)) + " bytes)"
	}
	switch {
	case pgErr != nil && err == nil:
		t.Errorf("%q: Postgres refuses it (%v), JSONBTextLen accepts it (%d bytes)", show, pgErr, got)
	case pgErr == nil && err != nil:
		t.Errorf("%q: Postgres accepts it (%d bytes), JSONBTextLen refuses it: %v", show, want, err)
	case pgErr == nil && got != want:
		t.Errorf("%q: JSONBTextLen says %d bytes, Postgres %d", show, got, want)
	}
}

func jsonbPool(t testing.TB) *pgxpool.Pool {
	return pgtest.New(t, pgtest.Options{MaxConns: 1, NoMigrate: true}).Pool
}

func TestJSONBTextLenMatchesPostgres(t *testing.T) {
	t.Parallel()
	pool := jsonbPool(t)
	for _, doc := range jsonbCases {
		require.True(t, json.Valid([]byte(doc)), "%.80q is not JSON, so it would not be compared", doc)
		checkJSONB(t, pool, []byte(doc))
	}
	g := jsonGen{r: rand.New(rand.NewPCG(1, 2))}
	n := 3000
	if testing.Short() {
		n = 300
	}
	for range n {
		checkJSONB(t, pool, g.doc())
	}
}

// FuzzJSONBTextLen compares JSONBTextLen with Postgres on arbitrary
// documents: go test -fuzz FuzzJSONBTextLen -run '^$' .
func FuzzJSONBTextLen(f *testing.F) {
	for _, doc := range jsonbCases {
		if len(doc) < 1000 {
			f.Add([]byte(doc))
		}
	}
	g := jsonGen{r: rand.New(rand.NewPCG(3, 4))}
	for range 50 {
		f.Add(g.doc())
	}
	pool := jsonbPool(f)
	f.Fuzz(func(t *testing.T, doc []byte) {
		checkJSONB(t, pool, doc)
	})
}

// jsonGen writes random JSON documents that lean on what JSONB rewrites or
// refuses: repeated keys, escapes, surrogates, non-ASCII text, exponents,
// negative zero, long numbers, top-level scalars, odd whitespace. A few are
// invalid UTF-8.
type jsonGen struct {
	r *rand.Rand
	b []byte
	// nasty lets in what JSONB refuses; without it the document is one
	// Postgres stores, so its length is compared.
	nasty bool
}

func (g *jsonGen) doc() []byte {
	g.b = g.b[:0]
	g.nasty = g.r.IntN(3) == 0
	g.value(0)
	g.space()
	return append([]byte(nil), g.b...)
}

func (g *jsonGen) space() {
	if g.r.IntN(4) == 0 {
		g.b = append(g.b, " \t\n\r  "[g.r.IntN(6):]...)
	}
}

func (g *jsonGen) value(depth int) {
	g.space()
	k := g.r.IntN(10)
	if depth == 0 && k >= 4 && g.r.IntN(3) > 0 {
		k %= 4 // mostly containers at the top
	}
	if depth >= 5 {
		k = 4 + g.r.IntN(6) // scalars only
	}
	switch k {
	case 0, 1:
		g.b = append(g.b, '{')
		n := g.r.IntN(6)
		if g.r.IntN(8) == 0 {
			n = 17 + g.r.IntN(30) // wide: past the few members compared pairwise
		}
		for i := range n {
			if i > 0 {
				g.b = append(g.b, ',')
			}
			g.space()
			g.key()
			g.space()
			g.b = append(g.b, ':')
			g.value(depth + 1)
			g.space()
		}
		g.b = append(g.b, '}')
	case 2, 3:
		g.b = append(g.b, '[')
		for i := range g.r.IntN(6) {
			if i > 0 {
				g.b = append(g.b, ',')
			}
			g.value(depth + 1)
			g.space()
		}
		g.b = append(g.b, ']')
	case 4, 5:
		g.str(1 + g.r.IntN(8))
	case 6, 7:
		g.number()
	default:
		g.b = append(g.b, []string{"true", "false", "null"}[g.r.IntN(3)]...)
	}
}

// key draws from few names, spelt several ways, so keys repeat.
func (g *jsonGen) key() {
	keys := []string{`"a"`, `"b"`, `"aa"`, `"\u0061"`, `"é"`, `"\u00e9"`, `"a\/b"`, `"a/b"`, `""`, `"\n"`, `"\u000a"`, `"😀"`, `"\ud83d\ude00"`}
	if g.r.IntN(5) == 0 {
		g.str(1 + g.r.IntN(3))
		return
	}
	g.b = append(g.b, keys[g.r.IntN(len(keys))]...)
}

func (g *jsonGen) str(pieces int) {
	g.b = append(g.b, '"')
	for range pieces {
		switch g.r.IntN(20) {
		case 0:
			g.b = append(g.b, `\"\\\/\b\f\n\r\t`[2*g.r.IntN(8):][:2]...)
		case 1: // a control character, escaped
			g.b = append(g.b, `\u00`...)
			g.b = append(g.b, "01"[g.r.IntN(2)], "0123456789abcdefABCDEF"[g.r.IntN(22)])
		case 2: // any BMP code point, surrogates and NUL included
			cp := g.r.IntN(0x10000)
			if !g.nasty && (cp == 0 || cp >= 0xd800 && cp < 0xe000) {
				cp = 0xe9
			}
			g.b = append(g.b, `\u`+hex4(cp)...)
		case 3: // a surrogate pair, sometimes broken
			hi, lo := 0xd800+g.r.IntN(0x400), 0xdc00+g.r.IntN(0x400)
			if g.nasty {
				switch g.r.IntN(4) {
				case 0:
					hi, lo = lo, hi
				case 1:
					lo = g.r.IntN(0x10000)
				}
			}
			g.b = append(g.b, `\u`+hex4(hi)+`\u`+hex4(lo)...)
		case 4:
			if g.nasty {
				g.b = append(g.b, []string{`\u0000`, `\\\u0000`, `\u0000x`}[g.r.IntN(3)]...)
			} else {
				g.b = append(g.b, []string{`\\u0000`, `\\\\u0000`, `\\\\\\u0000`}[g.r.IntN(3)]...)
			}
		case 5:
			g.b = append(g.b, []string{"é", "€", "😀", "\u2028", "\x7f", "ǅ"}[g.r.IntN(6)]...)
		case 6:
			if g.nasty && g.r.IntN(10) == 0 {
				g.b = append(g.b, []string{"\xff", "\xc3", "\xed\xa0\x80", "\xe2\x82"}[g.r.IntN(4)]...)
			}
		default:
			g.b = append(g.b, "abcxyz <&> 0123"[g.r.IntN(15):]...)
		}
	}
	g.b = append(g.b, '"')
}

func hex4(v int) string {
	s := strconv.FormatInt(int64(v), 16)
	return strings.Repeat("0", 4-len(s)) + s
}

func (g *jsonGen) number() {
	if g.r.IntN(3) == 0 {
		g.b = append(g.b, '-')
	}
	if g.r.IntN(3) == 0 {
		g.b = append(g.b, '0')
	} else {
		g.b = append(g.b, byte('1'+g.r.IntN(9)))
		g.digits(g.r.IntN(25))
	}
	if g.r.IntN(2) == 0 {
		g.b = append(g.b, '.')
		g.digits(1 + g.r.IntN(25))
	}
	if g.r.IntN(2) == 0 {
		g.b = append(g.b, "eE"[g.r.IntN(2)])
		if s := g.r.IntN(3); s > 0 {
			g.b = append(g.b, "+-"[s-1])
		}
		exps := []int{0, 1, 3, 30, 400, 16380, 16383, 16384, 16390, 131040, 131072, 200000}
		if !g.nasty {
			exps = exps[:5]
		}
		e := exps[g.r.IntN(len(exps))] + g.r.IntN(5) - 2
		if g.r.IntN(8) == 0 {
			g.b = append(g.b, "000"...)
		}
		g.b = strconv.AppendInt(g.b, int64(max(e, 0)), 10)
	}
}

func (g *jsonGen) digits(n int) {
	for range n {
		d := byte('0' + g.r.IntN(10))
		if g.r.IntN(3) == 0 {
			d = '0'
		}
		g.b = append(g.b, d)
	}
}

func TestJSONBGeneratorMakesValidJSON(t *testing.T) {
	t.Parallel()
	g := jsonGen{r: rand.New(rand.NewPCG(1, 2))}
	valid := 0
	for range 1000 {
		if json.Valid(g.doc()) {
			valid++
		}
	}
	require.Equal(t, 1000, valid, "the generator must write JSON encoding/json accepts, or the comparison skips it")
}

// order300 is a typical payload: about 300 bytes of compact JSON.
const order300 = `{"order_id":"6f1c2a9e-4b7d-4c1e-9a57-3f0d2b8c1e44","customer_id":"customer-42","total_cents":1999,"currency":"EUR","placed_at":"2026-01-01T12:00:00Z","shipping":{"name":"Ada Lovelace","street":"12 Example Street","city":"London","postcode":"N1 9GU","country":"GB"},"items":[{"sku":"SKU-1","qty":1,"price_cents":999},{"sku":"SKU-2","qty":2,"price_cents":500}]}`

// order100k is a large payload: about 100 kB, an order with many lines.
var order100k = func() string {
	var b strings.Builder
	b.WriteString(`{"order_id":"6f1c2a9e-4b7d-4c1e-9a57-3f0d2b8c1e44","items":[`)
	for i := 0; b.Len() < 100_000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"sku":"SKU-` + strconv.Itoa(i) + `","qty":` + strconv.Itoa(1+i%5) + `,"price_cents":` + strconv.Itoa(100+i*7) + `,"note":"gift wrap, \"fragile\" \u00e9"}`)
	}
	b.WriteString(`]}`)
	return b.String()
}()

func benchPayloads() []struct {
	name string
	raw  []byte
} {
	return []struct {
		name string
		raw  []byte
	}{{"300B", []byte(order300)}, {"100kB", []byte(order100k)}}
}

// BenchmarkValidate is Emit's checks of one event without the database:
// BenchmarkEmit's event (a struct, marshalled), then raw payloads with a
// traceparent header. With the default limit every payload here takes the
// linear scan only.
func BenchmarkValidate(b *testing.B) {
	p, err := outbox.NewProducer(outbox.Config{})
	require.NoError(b, err)
	b.Run("struct", func(b *testing.B) {
		ev := benchEvents(1)[0]
		b.ReportAllocs()
		for b.Loop() {
			if err := outbox.Validate(p, ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, pl := range benchPayloads() {
		b.Run(pl.name, func(b *testing.B) {
			ev := outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: json.RawMessage(pl.raw),
				Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
			b.SetBytes(int64(len(pl.raw)))
			b.ReportAllocs()
			for b.Loop() {
				if err := outbox.Validate(p, ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkJSONBTextLen is the exact length, repeated keys resolved: the
// path Emit takes only when the linear scan's figure is over the limit.
func BenchmarkJSONBTextLen(b *testing.B) {
	for _, pl := range benchPayloads() {
		b.Run(pl.name, func(b *testing.B) {
			b.SetBytes(int64(len(pl.raw)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := outbox.JSONBTextLen(pl.raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
