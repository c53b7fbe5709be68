package caddyfairqueue

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// UnmarshalJSON decodes the handler's JSON config as Caddy does, strictly
// (an unknown field is an error), and names the field of an error: the
// bare `time: invalid duration "abc"` of the decoder becomes
// `max_wait: invalid duration "abc"`, and an unknown field comes with
// the nearest option's name when one is near.
func (h *Handler) UnmarshalJSON(b []byte) error {
	type plain Handler // the fields without this method
	return decodeStrict(b, (*plain)(h))
}

// decodeStrict decodes b into v, unknown fields refused; a failure is
// explained by configError, which decodes each field on its own to find
// the one at fault.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		return nil
	}
	var syntax *json.SyntaxError
	if errors.As(err, &syntax) {
		return err // not a field's fault
	}
	if ferr := configError(b, reflect.TypeOf(v).Elem(), ""); ferr != nil {
		return ferr
	}
	return err
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
	durationType    = reflect.TypeFor[caddy.Duration]()
)

// configError returns the first error of raw decoded as a t, prefixed
// with its field's path (redis.dial_timeout, reject[1].status), or nil.
// A map's keys are left out of the path: they may be secrets (a tenant's
// value in weights).
func configError(raw json.RawMessage, t reflect.Type, path string) error {
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil
	}
	custom := reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler)
	switch {
	case custom:
	case t.Kind() == reflect.Pointer:
		return configError(raw, t.Elem(), path)
	case t.Kind() == reflect.Struct:
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			return leafError(path, err)
		}
		fields := jsonFields(t)
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range obj {
				if !yield(k) {
					return
				}
			}
		}) {
			f, ok := fields[k]
			if !ok {
				f, ok = foldField(fields, k) // encoding/json matches names without case
			}
			if !ok {
				names := make([]string, 0, len(fields))
				for n := range fields {
					names = append(names, n)
				}
				return prefixed(path, fmt.Errorf("unknown field %q%s", k, suggest(k, names, `"`)))
			}
			if err := configError(obj[k], f.Type, joinPath(path, k)); err != nil {
				return err
			}
		}
		return nil
	case t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8:
		var list []json.RawMessage
		if err := json.Unmarshal(raw, &list); err != nil {
			return leafError(path, err)
		}
		for i, el := range list {
			if err := configError(el, t.Elem(), path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		return nil
	case t.Kind() == reflect.Map:
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return leafError(path, err)
		}
		for _, v := range m {
			if err := configError(v, t.Elem(), path); err != nil {
				return err
			}
		}
		return nil
	}
	if err := json.Unmarshal(raw, reflect.New(t).Interface()); err != nil {
		var typ *json.UnmarshalTypeError
		if t == durationType && errors.As(err, &typ) {
			// caddy.Duration decodes a non-string as an int64: the error
			// names that, not the duration a string gives.
			return prefixed(path, fmt.Errorf(`want a duration such as "20s", got %s`, article(typ.Value)))
		}
		return leafError(path, err)
	}
	return nil
}

// jsonFields maps the JSON names of t's exported fields to the fields.
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	fields := make(map[string]reflect.StructField)
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		fields[name] = f
	}
	return fields
}

// foldField finds the field named k without regard to case.
func foldField(fields map[string]reflect.StructField, k string) (reflect.StructField, bool) {
	for n, f := range fields {
		if strings.EqualFold(n, k) {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// leafError says what is wrong with one value, without Go's type names.
func leafError(path string, err error) error {
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		return prefixed(path, fmt.Errorf("want %s, got %s", kindName(typ.Type), article(typ.Value)))
	}
	msg := err.Error()
	for _, p := range []string{"json: ", "time: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return prefixed(path, errors.New(msg))
}

// kindName names what a Go type holds in JSON's words.
func kindName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	default:
		return "an object"
	}
}

// article puts "a" or "an" before a JSON kind as encoding/json names it
// ("string", "number", "object", "array", "bool", "number 1.5").
func article(kind string) string {
	if kind == "" {
		return "a value of another kind"
	}
	if strings.IndexByte("aeiou", kind[0]) >= 0 {
		return "an " + kind
	}
	return "a " + kind
}

func joinPath(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func prefixed(path string, err error) error {
	if path == "" {
		return err
	}
	return fmt.Errorf("%s: %w", path, err)
}

// suggest returns ` (did you mean <q>name<q>?)` for the option nearest to
// typed, or "" when none is near enough to be a typo of it.
func suggest(typed string, options []string, q string) string {
	best, bestD := "", -1
	for _, o := range slices.Sorted(slices.Values(options)) {
		if d := editDistance(strings.ToLower(typed), o); bestD < 0 || d < bestD {
			best, bestD = o, d
		}
	}
	// A typo changes a letter or two, or leaves out an underscore;
	// longer names tolerate a little more.
	if bestD < 0 || bestD > max(2, len(typed)/4) || bestD >= len(typed) {
		// Cut short, as other clients spell it (addr, pass, user): the
		// one option it begins, if only one does.
		if best = onlyPrefixed(strings.ToLower(typed), options); best == "" {
			return ""
		}
	}
	return " (did you mean " + q + best + q + "?)"
}

// onlyPrefixed is the one option that begins with typed (of at least 3
// bytes), or "" when none or several do.
func onlyPrefixed(typed string, options []string) string {
	found := ""
	for _, o := range options {
		if len(typed) < 3 || !strings.HasPrefix(o, typed) {
			continue
		}
		if found != "" {
			return ""
		}
		found = o
	}
	return found
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
