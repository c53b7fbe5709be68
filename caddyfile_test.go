package caddyfairqueue

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func parse(input string) (*Handler, error) {
	h := new(Handler)
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
	return h, err
}

func TestCaddyfileParsesEveryOption(t *testing.T) {
	h, err := parse(`fair_queue {
		name {http.fair_queue.model}
		permits 8
		max_wait 45s
		poll_interval 100ms
		max_body 512KB
		body_timeout 10s
		max_waiting_bytes 64MiB
		lease 1m
		tenant {http.request.header.Authorization}
		weight "Bearer gold" 4
		weight "Bearer bronze" 0.5
		weight_placeholder {http.request.header.X-Weight}
		cost max_tokens 4096
		priority {http.request.header.X-Priority}
		priority_factor 4
		max_queue 100
		max_queue_per_tenant 10
		max_in_flight_per_tenant 3
		redis {
			url redis://caddy:secret@10.0.0.1:6380/3
			username other
			password {env.REDIS_PASSWORD}
			db 4
			tls
			key_prefix llm
			dial_timeout 250ms
			read_timeout 300ms
			write_timeout 350ms
		}
		on_store_error local
		local_permits 2
		reject {
			status 503
			retry_after 10s
			body "{}"
			sse_status 500
			sse_event busy
			sse_data "data"
		}
		reject timeout queue_full {
			retry_after auto
		}
	}`)
	require.NoError(t, err)
	want := &Handler{
		Name:                 "{http.fair_queue.model}",
		Permits:              8,
		MaxWait:              caddy.Duration(45 * time.Second),
		PollInterval:         caddy.Duration(100 * time.Millisecond),
		MaxBody:              512000,
		BodyTimeout:          caddy.Duration(10 * time.Second),
		MaxWaitingBytes:      64 << 20,
		Lease:                caddy.Duration(time.Minute),
		Tenant:               "{http.request.header.Authorization}",
		Weights:              map[string]float64{"Bearer gold": 4, "Bearer bronze": 0.5},
		WeightPlaceholder:    "{http.request.header.X-Weight}",
		Cost:                 CostMaxTokens,
		MaxCost:              4096,
		Priority:             "{http.request.header.X-Priority}",
		PriorityFactor:       4,
		MaxQueue:             100,
		MaxQueuePerTenant:    10,
		MaxInFlightPerTenant: 3,
		Redis: &RedisConfig{
			URL:          "redis://caddy:secret@10.0.0.1:6380/3",
			Username:     "other",
			Password:     "{env.REDIS_PASSWORD}",
			DB:           4,
			TLS:          true,
			KeyPrefix:    "llm",
			DialTimeout:  caddy.Duration(250 * time.Millisecond),
			ReadTimeout:  caddy.Duration(300 * time.Millisecond),
			WriteTimeout: caddy.Duration(350 * time.Millisecond),
		},
		OnStoreError: FailLocal,
		LocalPermits: 2,
		Reject: []*RejectConfig{
			{Status: 503, RetryAfter: "10s", Body: "{}", SSEStatus: 500, SSEEvent: "busy", SSEData: "data"},
			{Reasons: []string{"timeout", "queue_full"}, RetryAfter: "auto"},
		},
	}
	assert.Equal(t, want, h)
}

func TestCaddyfileParsesShortForms(t *testing.T) {
	for _, tc := range []struct {
		name, input string
		want        *RedisConfig
	}{
		{"url as argument", `fair_queue { 
			permits 1 
			redis redis://127.0.0.1:6379 
		}`, &RedisConfig{URL: "redis://127.0.0.1:6379"}},
		{"empty redis block", `fair_queue {
			permits 1
			redis
		}`, &RedisConfig{}},
		{"cluster addresses", `fair_queue {
			permits 1
			redis {
				mode cluster
				address a:1 b:2
			}
		}`, &RedisConfig{Mode: ModeCluster, Addresses: []string{"a:1", "b:2"}}},
		{"sentinel", `fair_queue {
			permits 1
			redis {
				mode sentinel
				master_name mymaster
				address s1:26379 s2:26379 s3:26379
				password {env.REDIS_PASSWORD}
				sentinel_username sentinel-user
				sentinel_password {env.SENTINEL_PASSWORD}
				db 2
			}
		}`, &RedisConfig{Mode: ModeSentinel, MasterName: "mymaster", Addresses: []string{"s1:26379", "s2:26379", "s3:26379"},
			Password: "{env.REDIS_PASSWORD}", SentinelUsername: "sentinel-user", SentinelPassword: "{env.SENTINEL_PASSWORD}", DB: 2}},
		{"explicit standalone", `fair_queue {
			permits 1
			redis {
				mode standalone
				address h:1
			}
		}`, &RedisConfig{Mode: ModeStandalone, Addresses: []string{"h:1"}}},
		{"url with placeholder is checked at load", `fair_queue {
			permits 1
			redis {env.REDIS_URL}
		}`, &RedisConfig{URL: "{env.REDIS_URL}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parse(tc.input)
			require.NoError(t, err)
			assert.Equal(t, tc.want, h.Redis)
			assert.Equal(t, 1, h.Permits)
		})
	}
}

func TestCaddyfileRefusesBadConfigNamingTheOption(t *testing.T) {
	for _, tc := range []struct {
		name, body, wantErr string
	}{
		{"permits missing", "redis", "permits is required"},
		{"permits zero", "permits 0", "permits must be at least 1"},
		{"permits negative", "permits -2", "permits must be at least 1"},
		{"permits not a number", "permits many", "permits: 'many' is not an integer"},
		{"permits without value", "permits", "wrong argument count"},
		{"permits with two values", "permits 1 2", "wrong argument count"},
		{"permits twice", "permits 1\npermits 2", "subdirective 'permits' is given twice"},
		{"unknown option", "permits 1\nbogus 1", "unrecognized subdirective 'bogus'"},
		{"poll interval too small", "permits 1\npoll_interval 10ms", "poll_interval must be at least 50ms"},
		{"poll interval above max wait", "permits 1\nmax_wait 1s\npoll_interval 2s", "poll_interval (2s) must not exceed max_wait (1s)"},
		{"poll interval above default max wait", "permits 1\npoll_interval 21s", "poll_interval (21s) must not exceed max_wait (20s)"},
		{"bad duration", "permits 1\nmax_wait soon", "max_wait: invalid duration 'soon'"},
		{"zero max wait", "permits 1\nmax_wait 0s", "max_wait must be at least 50ms, got 0s"},
		{"max wait below the smallest poll interval", "permits 1\nmax_wait 30ms", "max_wait must be at least 50ms, got 30ms"},
		{"lease too short", "permits 1\nlease 10ms", "lease must be at least 1s"},
		{"abort grace not a duration", "permits 1\nabort_grace never", "abort_grace: want a duration of at least 1ms or off, got 'never'"},
		{"abort grace too long", "permits 1\nabort_grace 2m", "abort_grace must be at most 1m0s, got 2m0s"},
		{"bad size", "permits 1\nmax_body lots", "max_body: invalid size 'lots'"},
		{"zero size", "permits 1\nmax_body 0", "max_body must be positive"},
		{"body timeout too short", "permits 1\nbody_timeout 10ms", "body_timeout must be at least 100ms, got 10ms"},
		{"body timeout not a duration", "permits 1\nbody_timeout slow", "body_timeout: invalid duration 'slow'"},
		{"max waiting bytes zero", "permits 1\nmax_waiting_bytes 0", "max_waiting_bytes must be positive"},
		{"max waiting bytes below max body", "permits 1\nmax_body 1MiB\nmax_waiting_bytes 512KiB", "max_waiting_bytes (524288) must be at least max_body (1048576)"},
		{"max waiting bytes below the default max body", "permits 1\nmax_waiting_bytes 1MiB", "max_waiting_bytes (1048576) must be at least max_body (8388608)"},
		{"bad store error policy", "permits 1\non_store_error shrug", "on_store_error must be fail_open, fail_closed or local, got \"shrug\""},
		{"unknown redis option", "permits 1\nredis {\nhost x\n}", "unrecognized subdirective 'host'"},
		{"bad redis url", "permits 1\nredis {\nurl http://x\n}", "redis: invalid url: redis: invalid URL scheme: http"},
		{"bad redis url hides password", "permits 1\nredis {\nurl redis://u:pa%zzss@h\n}", "redis: invalid url"},
		{"url twice", "permits 1\nredis redis://a {\nurl redis://b\n}", "redis: url is given twice"},
		{"url and address", "permits 1\nredis {\nurl redis://a\naddress b:1\n}", "url and address are mutually exclusive"},
		{"address without value", "permits 1\nredis {\naddress\n}", "wrong argument count"},
		{"db on cluster", "permits 1\nredis {\nmode cluster\naddress a:1 b:1\ndb 2\n}", "redis: db must be 0 with mode cluster, got 2"},
		{"negative db", "permits 1\nredis {\ndb -1\n}", "db must be at least 0"},
		{"tls with argument", "permits 1\nredis {\ntls yes\n}", "wrong argument count"},
		{"zero timeout", "permits 1\nredis {\nread_timeout 0s\n}", "read_timeout must be at least 1ms, got 0s"},
		{"unknown reason", "permits 1\nreject slow {\nstatus 500\n}", "reject: unknown reason \"slow\""},
		{"empty reject", "permits 1\nreject timeout", "reject: a block with at least one option is required"},
		{"bad status", "permits 1\nreject {\nstatus 99\n}", "reject: status must be 200-599, got 99"},
		{"status too high", "permits 1\nreject {\nstatus 600\n}", "reject: status must be 200-599, got 600"},
		{"informational status", "permits 1\nreject {\nstatus 103\n}", "reject: status must be 200-599, got 103"},
		{"bad sse status", "permits 1\nreject {\nsse_status 700\n}", "reject: sse_status must be 200-599, got 700"},
		{"bad retry after", "permits 1\nreject {\nretry_after later\n}", "reject: retry_after must be a positive duration or auto"},
		{"unknown reject option", "permits 1\nreject {\ncolor red\n}", "unrecognized subdirective 'color'"},
		{"reject option twice", "permits 1\nreject {\nstatus 500\nstatus 501\n}", "subdirective 'status' is given twice"},
		{"reject field twice for one reason", "permits 1\nreject timeout {\nstatus 500\n}\nreject timeout queue_full {\nstatus 501\n}", "reject: status is set twice for reason timeout"},
		{"reject default twice", "permits 1\nreject {\nbody x\n}\nreject {\nbody y\n}", "reject: body is set twice for every reason"},

		{"tenant without value", "permits 1\ntenant", "wrong argument count"},
		{"tenant with two values", "permits 1\ntenant a b", "wrong argument count"},
		{"tenant twice", "permits 1\ntenant a\ntenant b", "subdirective 'tenant' is given twice"},
		{"weight without tenant", "permits 1\nweight a 2", "weight requires tenant"},
		{"weight without weight", "permits 1\ntenant x\nweight a", "wrong argument count"},
		{"weight with three values", "permits 1\ntenant x\nweight a 2 3", "wrong argument count"},
		{"weight not a number", "permits 1\ntenant x\nweight a heavy", "weight: the weight (the second argument) is not a number"},
		{"weight too small", "permits 1\ntenant x\nweight a 0.001", "weight must be 0.01 to 1000, got 0.001"},
		{"weight too large", "permits 1\ntenant x\nweight a 1001", "weight must be 0.01 to 1000, got 1001"},
		{"weight NaN", "permits 1\ntenant x\nweight a NaN", "weight: the weight (the second argument) is not a number"},
		{"weight twice for one tenant", "permits 1\ntenant x\nweight a 2\nweight a 3", "weight: tenant sha256:ca978112ca1bbdca is given twice"},
		{"weight placeholder without tenant", "permits 1\nweight_placeholder {http.request.header.W}", "weight_placeholder requires tenant"},
		{"weight placeholder twice", "permits 1\ntenant x\nweight_placeholder a\nweight_placeholder b", "subdirective 'weight_placeholder' is given twice"},
		{"cost without source", "permits 1\ntenant x\ncost", "wrong argument count"},
		{"cost unknown mode", "permits 1\ntenant x\ncost prompt_tokens", "cost: unknown mode 'prompt_tokens' (want requests, max_tokens, time, tokens)"},
		{"cost time with a max", "permits 1\ntenant x\ncost time 30", "cost: mode time takes no max (only max_tokens and tokens do)"},
		{"cost requests with a max", "permits 1\ntenant x\ncost requests 5", "cost: mode requests takes no max"},
		{"cost tokens max zero", "permits 1\ntenant x\ncost tokens 0", "cost: max must be 1 to 1000000, got 0"},
		{"cost tokens max not a number", "permits 1\ntenant x\ncost tokens many", "cost: max 'many' is not an integer"},
		{"cost tokens in a FIFO queue", "permits 1\ncost tokens", "cost requires tenant or priority"},
		{"cost time in a FIFO queue", "permits 1\ncost time", "cost requires tenant or priority"},
		{"max in flight without tenant", "permits 1\nmax_in_flight_per_tenant 2", "max_in_flight_per_tenant requires tenant or priority"},
		{"max in flight negative", "permits 1\ntenant x\nmax_in_flight_per_tenant -1", "max_in_flight_per_tenant must be at least 0, got -1"},
		{"max in flight not a number", "permits 1\ntenant x\nmax_in_flight_per_tenant two", "max_in_flight_per_tenant: 'two' is not an integer"},
		{"max in flight without value", "permits 1\ntenant x\nmax_in_flight_per_tenant", "wrong argument count"},
		{"max in flight twice", "permits 1\ntenant x\nmax_in_flight_per_tenant 1\nmax_in_flight_per_tenant 2", "subdirective 'max_in_flight_per_tenant' is given twice"},
		{"cost max not a number", "permits 1\ntenant x\ncost max_tokens lots", "cost: max 'lots' is not an integer"},
		{"cost max zero", "permits 1\ntenant x\ncost max_tokens 0", "cost: max must be 1 to 1000000, got 0"},
		{"cost max too large", "permits 1\ntenant x\ncost max_tokens 1000001", "cost: max must be 1 to 1000000, got 1000001"},
		{"cost with extra argument", "permits 1\ntenant x\ncost max_tokens 10 20", "wrong argument count"},
		{"cost in a FIFO queue", "permits 1\ncost max_tokens", "cost requires tenant or priority"},
		{"cost twice", "permits 1\ntenant x\ncost max_tokens\ncost max_tokens 5", "subdirective 'cost' is given twice"},
		{"priority without value", "permits 1\npriority", "wrong argument count"},
		{"priority factor too small", "permits 1\npriority p\npriority_factor 1.5", "priority_factor must be at least 2, got 1.5"},
		{"priority factor not a number", "permits 1\npriority p\npriority_factor high", "priority_factor: 'high' is not a number"},
		{"max queue negative", "permits 1\nmax_queue -1", "max_queue must be at least 0, got -1"},
		{"max queue not a number", "permits 1\nmax_queue many", "max_queue: 'many' is not an integer"},
		{"max queue twice", "permits 1\nmax_queue 1\nmax_queue 2", "subdirective 'max_queue' is given twice"},
		{"per-tenant cap without tenant", "permits 1\nmax_queue_per_tenant 3", "max_queue_per_tenant requires tenant"},
		{"per-tenant cap negative", "permits 1\ntenant x\nmax_queue_per_tenant -3", "max_queue_per_tenant must be at least 0, got -3"},
		{"local permits without local", "permits 1\nlocal_permits 2", "local_permits requires on_store_error local"},
		{"local permits zero", "permits 1\non_store_error local\nlocal_permits 0", "local_permits must be at least 1, got 0"},
		{"local permits twice", "permits 1\non_store_error local\nlocal_permits 1\nlocal_permits 2", "subdirective 'local_permits' is given twice"},
		{"unknown redis mode", "permits 1\nredis {\nmode ring\n}", "redis: mode must be standalone, sentinel or cluster, got \"ring\""},
		{"redis mode twice", "permits 1\nredis {\nmode cluster\nmode cluster\naddress a:1\n}", "subdirective 'mode' is given twice"},
		{"several addresses in standalone", "permits 1\nredis {\naddress a:1 b:1\n}", "redis: mode standalone takes one address, got 2 (set mode cluster or sentinel for several)"},
		{"cluster without address", "permits 1\nredis {\nmode cluster\n}", "redis: mode cluster needs at least one address"},
		{"cluster with url", "permits 1\nredis redis://h:1 {\nmode cluster\n}", "redis: url is for mode standalone only"},
		{"sentinel without master", "permits 1\nredis {\nmode sentinel\naddress s:26379\n}", "redis: mode sentinel needs master_name"},
		{"sentinel without address", "permits 1\nredis {\nmode sentinel\nmaster_name m\n}", "redis: mode sentinel needs at least one address"},
		{"master name outside sentinel", "permits 1\nredis {\nmaster_name m\n}", "redis: master_name is for mode sentinel only"},
		{"sentinel password outside sentinel", "permits 1\nredis {\nsentinel_password pa%zzss\n}", "redis: sentinel_username and sentinel_password are for mode sentinel only"},
		{"master name without value", "permits 1\nredis {\nmode sentinel\nmaster_name\n}", "wrong argument count"},
		{"names with a fixed name", "permits 1\nname llm\nnames a b", "names requires a name with placeholders"},
		{"names without a name", "permits 1\nnames a", "names requires a name with placeholders"},
		{"names without value", "permits 1\nname {http.fair_queue.model}\nnames", "wrong argument count"},
		{"name listed twice", "permits 1\nname {http.fair_queue.model}\nnames a b\nnames a", "names: \"a\" is listed twice"},
		{"names too long", "permits 1\nname {http.fair_queue.model}\nnames " + strings.Repeat("n", 201), "names: a name is longer than 200 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse("fair_queue {\n" + tc.body + "\n}")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.Contains(t, err.Error(), "Testfile:", "the error carries the file and line")
			assert.NotContains(t, err.Error(), "pa%zzss", "the error must not echo a password")
		})
	}
}

func TestCaddyfileRefusesArgumentsAfterDirective(t *testing.T) {
	_, err := parse("fair_queue extra {\npermits 1\n}")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "wrong argument count")
}

func TestCaddyfileErrorPointsAtTheOffendingLine(t *testing.T) {
	_, err := parse("fair_queue {\n\tpermits 1\n\tmax_wait 10s\n\tpoll_interval 1ms\n}")
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "Testfile:4"), "error %q should name line 4", err)
}

func TestCaddyfileDefaultsOfTheFairnessOptions(t *testing.T) {
	h, err := parse("fair_queue {\npermits 2\ntenant {http.request.remote.host}\ncost max_tokens\n}")
	require.NoError(t, err)
	assert.Equal(t, CostMaxTokens, h.Cost)
	assert.Zero(t, h.MaxCost, "the default max is applied at provision")
	h.setDefaults()
	assert.Equal(t, DefaultMaxCost, h.MaxCost)
	assert.Equal(t, float64(fairqueue.DefaultPriorityFactor), h.PriorityFactor)
	require.NoError(t, h.validate())

	// priority alone makes the queue fair, and allows cost.
	_, err = parse("fair_queue {\npermits 2\npriority {http.request.header.X-Priority}\ncost max_tokens\n}")
	require.NoError(t, err)
}

func TestCaddyfileShortMaxWaitNeedsNoPollInterval(t *testing.T) {
	h, err := parse("fair_queue {\npermits 1\nmax_wait 100ms\n}")
	require.NoError(t, err)
	h.setDefaults()
	require.NoError(t, h.validate(), "the default poll interval follows a short max_wait")
	assert.Equal(t, caddy.Duration(100*time.Millisecond), h.PollInterval)

	h, err = parse("fair_queue {\npermits 1\nmax_wait 1s\n}")
	require.NoError(t, err)
	h.setDefaults()
	assert.Equal(t, caddy.Duration(fairqueue.DefaultPollInterval), h.PollInterval)
}

func TestCaddyfileAbortGraceTakesADurationOrOff(t *testing.T) {
	h, err := parse("fair_queue {\npermits 1\nabort_grace 2s\n}")
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, h.abortGrace())
	h, err = parse("fair_queue {\npermits 1\nabort_grace off\n}")
	require.NoError(t, err)
	assert.Equal(t, caddy.Duration(-1), h.AbortGrace, "off is stored as a negative duration")
	assert.Zero(t, h.abortGrace(), "off: handed on at once")
	h, err = parse("fair_queue {\npermits 1\n}")
	require.NoError(t, err)
	assert.Equal(t, DefaultAbortGrace, h.abortGrace())
}
