package caddyfairqueue

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// notCaddyOptions are the engine settings a Caddy config cannot set: the
// engine's defaults apply to every queue, so handlers always agree.
var notCaddyOptions = map[string]bool{"StoreTimeout": true, "DownAfter": true}

// TestSettingsDiffNamesEveryEngineSetting holds the comparison of two
// handlers' queue settings to fairqueue.Config itself: a field added to
// the engine's configuration is compared, and named as the option that
// sets it, with no list to update.
func TestSettingsDiffNamesEveryEngineSetting(t *testing.T) {
	options := map[string]bool{}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[Handler]()) {
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" {
			options[name] = true
		}
	}
	fields := reflect.VisibleFields(reflect.TypeFor[fairqueue.Config]())
	names := map[string]bool{}
	for _, f := range fields {
		names[f.Name] = true
	}
	for name := range perEngine {
		assert.True(t, names[name], "perEngine names %s, which fairqueue.Config no longer has", name)
	}
	base := (&Handler{Name: "q", Permits: 2}).settings()
	for i, f := range fields {
		if !f.IsExported() || perEngine[f.Name] || f.Name == "Fair" || f.Name == "FailOpen" {
			continue // not a setting (as diff reads them), set per engine, or compared apart
		}
		if !notCaddyOptions[f.Name] {
			assert.True(t, options[optionName(f.Name)], "fairqueue.Config.%s reads as option %q, which Handler has not", f.Name, optionName(f.Name))
		}
		other := base
		v := reflect.ValueOf(&other.cfg).Elem().Field(i)
		switch v.Kind() {
		case reflect.Int, reflect.Int64:
			v.SetInt(v.Int() + 7)
		case reflect.Float64:
			v.SetFloat(v.Float() + 0.5)
		case reflect.Slice:
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		case reflect.Pointer:
			v.Set(reflect.New(v.Type().Elem()))
		default:
			require.Failf(t, "no test value", "fairqueue.Config.%s of kind %s", f.Name, v.Kind())
		}
		assert.True(t, strings.HasPrefix(base.diff(other), optionName(f.Name)+" ("), "a change of %s reads %q", f.Name, base.diff(other))
		assert.Empty(t, other.diff(other))
	}
}

func TestSettingsDiffReadsEmptyAndAbsentUpstreamsAlike(t *testing.T) {
	a := (&Handler{Permits: 1}).settings()
	b := (&Handler{Permits: 1, Upstreams: []fairqueue.Upstream{}}).settings()
	assert.Empty(t, a.diff(b))
}
