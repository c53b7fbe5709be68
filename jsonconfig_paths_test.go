package caddyfairqueue

import (
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every JSON path a config error names resolves in the Handler's JSON:
// each name is a field of the block it stands in, as its struct tag
// spells it, each [i] an entry of a list, each ["k"] or [<...>] an entry
// of an object. A path that names no field (the Caddyfile's option, a
// field renamed) would send the operator looking for what is not there.
func TestEveryJSONPathInAConfigErrorResolvesInTheHandlersJSON(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	t.Setenv("FQ_TEST_UNSET", "")
	const pool = `"upstreams":[{"dial":"127.0.0.1:8000","permits":2}],`
	for _, wrong := range []string{"weight", "redis.address", "reject[0].statuses", "reject.status", "upstreams[0][1]", "names.x"} {
		require.Error(t, resolveJSONPath(reflect.TypeFor[Handler](), wrong), "%s resolves", wrong)
	}
	checked := 0
	for _, fields := range []string{
		`"permits":1,"tenant":"t","weights":{"sha256:0123456789abcdef":5000}`,
		`"permits":1,"tenant":"t","weights":{"sk-live-4f9a2c":5000}`,
		`"permits":1,"tenant":"t","weights":{"sha256:0123":2}`,
		`"permits":1,"tenant":"t","weights":{"` + strings.Repeat("x", maxTenantLen+1) + `":2}`,
		`"permits":1,"weights":{"a":2}`,
		`"permits":1,"tenant":"t","weights":{"{env.FQ_TEST_UNSET}":2}`,
		`"permits":1,"reject":[{"status":429},{"status":100}]`,
		`"permits":1,"reject":[{"sse_status":100}]`,
		`"permits":1,"reject":[{"reasons":["timeout","bogus"],"status":500}]`,
		`"permits":1,"reject":[{"retry_after":"x"}]`,
		`"permits":1,"reject":[{"sse_event":"a\nb"}]`,
		`"permits":1,"reject":[{"body":"x"},{"body":"y"}]`,
		`"permits":1,"reject":[{"sse_data":"x"},{"sse_data":"y"}]`,
		`"permits":1,"reject":[{"sse_event":"x"},{"sse_event":"y"}]`,
		`"permits":1,"reject":[{"retry_after":"1s"},{"retry_after":"2s"}]`,
		`"permits":1,"reject":[{"sse_status":500},{"sse_status":502}]`,
		`"upstreams":[{"dial":"http://127.0.0.1:8000","permits":1}]`,
		`"upstreams":[{"dial":"","permits":1}]`,
		`"upstreams":[{"dial":"a b:1","permits":1}]`,
		`"upstreams":[{"dial":"a:1","permits":1},{"dial":"b:1"}]`,
		`"upstreams":[{"dial":"a:1","permits":1},{"dial":"a:1","permits":1}]`,
		`"upstreams":[{"dial":"a:1","permits":1,"kv_tokens":-5}]`,
		`"upstreams":[{"dial":"a:1","permits":1,"kv_tokens":10},{"dial":"b:1","permits":1}]`,
		`"permits":1,"name":"{http.fair_queue.model}",` + pool[:len(pool)-1],
		pool + `"requeue_on":[429,200]`,
		`"permits":1,"requeue_on":[429]`,
		`"permits":1,"max_requeues":2`,
		`"permits":1,"upstream_cooldown":"1s"`,
		`"permits":1,"name":"{http.fair_queue.model}","names":["a","b","a"]`,
		`"permits":1,"name":"{http.fair_queue.model}","names":[""]`,
		`"permits":1,"names":["a"]`,
		`"permits":1,"redis":{"mode":"ring"}`,
		`"permits":1,"redis":{"addresses":["a:1","b:2"]}`,
		`"permits":1,"redis":{"mode":"cluster"}`,
		`"permits":1,"redis":{"url":"redis://a:1","addresses":["b:2"]}`,
		`"permits":1,"redis":{"mode":"cluster","url":"redis://a:1"}`,
		`"permits":1,"redis":{"url":"bogus://x"}`,
		`"permits":1,"redis":{"read_timeout":500}`,
		`"permits":1,"redis":{"dial_timeout":-1}`,
		`"permits":1,"redis":{"mode":"cluster","addresses":["a:1"],"db":2}`,
		`"permits":1,"redis":{"db":-1}`,
		`"permits":1,"redis":{"mode":"sentinel","addresses":["a:1"]}`,
		`"permits":1,"redis":{"master_name":"m"}`,
		`"permits":1,"redis":{"sentinel_username":"u"}`,
		`"permits":1,"redis":{"sentinel_password":"p"}`,
		`"permits":1,"redis":{"key_prefix":"{env.FQ_TEST_UNSET}"}`,
		`"permits":1,"redis":{"mode":"sentinel","addresses":["a:1"],"master_name":"{env.FQ_TEST_UNSET}"}`,
		`"permits":1,"redis":{"addresses":["{env.FQ_TEST_UNSET}"]}`,
		`"permits":1,"redis":{},"reject_stream":{"maxlen":5}`,
		`"permits":1,"redis":{},"reject_stream":{"key":"k","maxlen":-1}`,
		`"permits":1,"redis":{},"reject_stream":{"key":"{env.FQ_TEST_UNSET}"}`,
		`"permits":1,"redis":{},"reject_stream":{"key":"k","fields":{"reason":"x"}}`,
		`"permits":1,"redis":{},"reject_stream":{"key":"k","fields":{"":"x"}}`,
		`"permits":1,"adaptive":{"floor":2,"target_ttft":"1s"}`,
		`"permits":1,"adaptive":{}`,
	} {
		err := loadHandlerJSON(t, fields)
		require.Error(t, err, "%s loads", fields)
		_, msg, ok := strings.Cut(err.Error(), "provision http.handlers.fair_queue: ")
		require.True(t, ok, "%s: not refused by Provision: %v", fields, err)
		path, _, ok := strings.Cut(msg, ": ")
		if !ok || strings.Contains(path, " ") {
			continue // an option both spell alike, named in the message
		}
		assert.NoError(t, resolveJSONPath(reflect.TypeFor[Handler](), path), "%s\n%s", fields, msg)
		checked++
	}
	assert.GreaterOrEqual(t, checked, 50, "errors that name a path")
}

var jsonPathSegment = regexp.MustCompile(`^([a-z_]+)((?:\[(?:\d+|"(?:[^"\\]|\\.)*"|<[^>]*>)\])*)$`)

// resolveJSONPath walks path (a.b[1].c["k"]) through t's JSON.
func resolveJSONPath(t reflect.Type, path string) error {
	for _, seg := range splitJSONPath(path) {
		m := jsonPathSegment.FindStringSubmatch(seg)
		if m == nil {
			return &pathError{path, seg, "not a path segment"}
		}
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return &pathError{path, seg, "a field of " + t.String()}
		}
		f, ok := jsonFieldOf(t, m[1])
		if !ok {
			return &pathError{path, seg, "no field " + strconv.Quote(m[1]) + " in " + t.String()}
		}
		t = f.Type
		for _, idx := range regexp.MustCompile(`\[[^\]]*\]`).FindAllString(m[2], -1) {
			for t.Kind() == reflect.Pointer {
				t = t.Elem()
			}
			switch {
			case idx[1] >= '0' && idx[1] <= '9' && t.Kind() == reflect.Slice:
			case !(idx[1] >= '0' && idx[1] <= '9') && t.Kind() == reflect.Map:
			default:
				return &pathError{path, seg, idx + " of a " + t.Kind().String()}
			}
			t = t.Elem()
		}
	}
	return nil
}

// splitJSONPath splits path at the dots outside its brackets.
func splitJSONPath(path string) []string {
	var segs []string
	depth, start := 0, 0
	for i, r := range path {
		switch {
		case r == '[':
			depth++
		case r == ']':
			depth--
		case r == '.' && depth == 0:
			segs = append(segs, path[start:i])
			start = i + 1
		}
	}
	return append(segs, path[start:])
}

// jsonFieldOf is t's field of JSON name, through embedded structs.
func jsonFieldOf(t reflect.Type, name string) (reflect.StructField, bool) {
	if f, ok := jsonFields(t)[name]; ok && !f.Anonymous {
		return f, true
	}
	for i := range t.NumField() {
		if f := t.Field(i); f.Anonymous && f.Tag.Get("json") == "" {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				if g, ok := jsonFieldOf(ft, name); ok {
					return g, true
				}
			}
		}
	}
	return reflect.StructField{}, false
}

type pathError struct{ path, seg, why string }

func (e *pathError) Error() string { return e.path + ": at " + e.seg + ": " + e.why }
