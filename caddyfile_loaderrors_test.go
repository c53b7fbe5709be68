package caddyfairqueue

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Caddyfile whose options take an {env.*} placeholder adapts; the
// placeholder is replaced when the config loads (Provision), and one
// that comes out empty is refused then. The error was worded in the JSON
// config's terms only ("redis.addresses[0]: is empty once its
// placeholders are replaced", "weights[\"{env.GOLD}\"]: ..."), paths the
// operator never wrote: it names the Caddyfile's option too, as `caddy
// adapt` words the same mistake.
func TestCaddyfileLoadErrorsNameTheCaddyfileOption(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	t.Setenv("FQ_TEST_UNSET", "")
	t.Setenv("FQ_TEST_BAD_URL", "bogus://x")
	for name, tc := range map[string]struct{ lines, want string }{
		"weight tenant": {"tenant {http.request.header.Authorization}\n\t\tweight {env.FQ_TEST_UNSET} 2",
			"weight: a tenant is empty once its placeholders are replaced"},
		"redis address": {"redis {\n\t\t\taddress {env.FQ_TEST_UNSET}\n\t\t}",
			"redis: an address is empty once its placeholders are replaced"},
		"redis key_prefix": {"redis {\n\t\t\tkey_prefix {env.FQ_TEST_UNSET}\n\t\t}",
			"redis: key_prefix is empty once its placeholders are replaced"},
		"redis master_name": {"redis {\n\t\t\tmode sentinel\n\t\t\taddress 127.0.0.1:26379\n\t\t\tmaster_name {env.FQ_TEST_UNSET}\n\t\t}",
			"redis: master_name is empty once its placeholders are replaced"},
		"redis url": {"redis {env.FQ_TEST_BAD_URL}", "redis: invalid url"},
		"reject_stream key": {"redis\n\t\treject_stream {env.FQ_TEST_UNSET}",
			`reject_stream: key "{env.FQ_TEST_UNSET}" is empty once replaced`},
	} {
		t.Run(name, func(t *testing.T) {
			caddyfile := ":0 {\n\tfair_queue {\n\t\tpermits 1\n\t\t" + tc.lines + "\n\t}\n}\n"
			out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
			require.NoError(t, err, "the Caddyfile adapts: the placeholder is replaced at load\n%s", caddyfile)
			var cfg caddy.Config
			require.NoError(t, json.Unmarshal(out, &cfg))
			err = caddy.Validate(&cfg)
			require.Error(t, err, "%s", out)
			_, msg, ok := strings.Cut(err.Error(), "provision http.handlers.fair_queue: ")
			require.True(t, ok, "refused by Provision: %v", err)
			assert.Contains(t, msg, tc.want, "the Caddyfile's option, as adapt words it")
		})
	}
}
