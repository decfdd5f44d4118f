// Canonical JSON, chain format 2 (docs/wire.md, "Canonical JSON"): RFC 8785 with one extension,
// integers beyond ±(2^53 − 1) written as their exact digits.
//
// Values are what encoding/json gives with UseNumber (nil, bool, string, json.Number,
// []any, map[string]any) plus the Go numbers a writer builds events from (int, int64,
// uint64, float64).
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
)

var integerLiteral = regexp.MustCompile(`^-?[0-9]+$`)

// Canonical returns the canonical JSON bytes of v.
func Canonical(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := writeCanonical(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// MustCanonical is Canonical for values the program built itself (never NaN, never a foreign type).
func MustCanonical(v any) []byte {
	out, err := Canonical(v)
	if err != nil {
		panic(err)
	}
	return out
}

func writeCanonical(b *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case string:
		writeString(b, x)
	case int:
		b.WriteString(strconv.FormatInt(int64(x), 10))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case uint64:
		b.WriteString(strconv.FormatUint(x, 10))
	case float64:
		text, err := formatDouble(x)
		if err != nil {
			return err
		}
		b.WriteString(text)
	case json.Number:
		text, err := formatNumber(x)
		if err != nil {
			return err
		}
		b.WriteString(text)
	case []any:
		b.WriteByte('[')
		for i, item := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, item); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		names := make([]string, 0, len(x))
		for name := range x {
			names = append(names, name)
		}
		// Members sorted by the UTF-16 code units of their names.
		sort.Slice(names, func(i, j int) bool { return lessUTF16(names[i], names[j]) })
		b.WriteByte('{')
		for i, name := range names {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, name)
			b.WriteByte(':')
			if err := writeCanonical(b, x[name]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("cannot canonicalize a %T", v)
	}
	return nil
}

func lessUTF16(a, b string) bool {
	ua, ub := utf16.Encode([]rune(a)), utf16.Encode([]rune(b))
	for i := 0; i < len(ua) && i < len(ub); i++ {
		if ua[i] != ub[i] {
			return ua[i] < ub[i]
		}
	}
	return len(ua) < len(ub)
}

// writeString escapes only '"', '\\' and control characters (\b \f \n \r \t, others \u00xx).
func writeString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// formatNumber writes a number as read from JSON text: an integer literal exactly (the extension
// for |n| > 2^53 − 1; within that range its digits are the double's), anything else as a double.
func formatNumber(n json.Number) (string, error) {
	text := string(n)
	if integerLiteral.MatchString(text) {
		value, ok := new(big.Int).SetString(text, 10)
		if !ok {
			return "", fmt.Errorf("not a number: %s", text)
		}
		return value.String(), nil
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return "", fmt.Errorf("not a finite number: %s", text)
	}
	return formatDouble(f)
}

// formatDouble is ECMAScript's Number.prototype.toString for a double, as JCS requires.
func formatDouble(f float64) (string, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "", fmt.Errorf("NaN and infinity are not JSON")
	}
	if f == 0 {
		return "0", nil // -0 too
	}
	sign := ""
	if f < 0 {
		sign, f = "-", -f
	}
	// Shortest round-trip digits and the decimal exponent: f = 0.DIGITS × 10^n.
	mantissa, exp, _ := strings.Cut(strconv.FormatFloat(f, 'e', -1, 64), "e")
	digits := strings.Replace(mantissa, ".", "", 1)
	e, _ := strconv.Atoi(exp)
	k, n := len(digits), e+1
	switch {
	case k <= n && n <= 21:
		return sign + digits + strings.Repeat("0", n-k), nil
	case 0 < n && n <= 21:
		return sign + digits[:n] + "." + digits[n:], nil
	case -6 < n && n <= 0:
		return sign + "0." + strings.Repeat("0", -n) + digits, nil
	}
	out := digits[:1]
	if k > 1 {
		out += "." + digits[1:]
	}
	if n-1 > 0 {
		return sign + out + "e+" + strconv.Itoa(n-1), nil
	}
	return sign + out + "e-" + strconv.Itoa(1-n), nil
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Digest is the lowercase hex sha256 of v's canonical JSON (docs/wire.md, "Digests").
func Digest(v any) string { return sha256Hex(MustCanonical(v)) }

// KeyToken is the subject token of an idempotency key: the first 32 hex digits of sha256 of its UTF-8 bytes.
func KeyToken(key string) string { return sha256Hex([]byte(key))[:32] }

// ParseJSON reads JSON text keeping every number as written (json.Number).
func ParseJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}
