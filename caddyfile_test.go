package caddyfairqueue

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		lease 1m
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
		on_store_error fail_closed
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
		Name:         "{http.fair_queue.model}",
		Permits:      8,
		MaxWait:      caddy.Duration(45 * time.Second),
		PollInterval: caddy.Duration(100 * time.Millisecond),
		MaxBody:      512000,
		Lease:        caddy.Duration(time.Minute),
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
		OnStoreError: FailClosed,
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
				address a:1 b:2
			}
		}`, &RedisConfig{Addresses: []string{"a:1", "b:2"}}},
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
		{"zero max wait", "permits 1\nmax_wait 0s", "max_wait must be positive"},
		{"lease too short", "permits 1\nlease 10ms", "lease must be at least 1s"},
		{"bad size", "permits 1\nmax_body lots", "max_body: invalid size 'lots'"},
		{"zero size", "permits 1\nmax_body 0", "max_body must be positive"},
		{"bad store error policy", "permits 1\non_store_error shrug", "on_store_error must be fail_open or fail_closed, got 'shrug'"},
		{"unknown redis option", "permits 1\nredis {\nhost x\n}", "unrecognized subdirective 'host'"},
		{"bad redis url", "permits 1\nredis {\nurl http://x\n}", "redis: invalid url: redis: invalid URL scheme: http"},
		{"bad redis url hides password", "permits 1\nredis {\nurl redis://u:pa%zzss@h\n}", "redis: invalid url"},
		{"url twice", "permits 1\nredis redis://a {\nurl redis://b\n}", "redis: url is given twice"},
		{"url and address", "permits 1\nredis {\nurl redis://a\naddress b:1\n}", "url and address are mutually exclusive"},
		{"address without value", "permits 1\nredis {\naddress\n}", "wrong argument count"},
		{"db on cluster", "permits 1\nredis {\naddress a:1 b:1\ndb 2\n}", "db must be 0 with a Redis Cluster"},
		{"negative db", "permits 1\nredis {\ndb -1\n}", "db must be at least 0"},
		{"tls with argument", "permits 1\nredis {\ntls yes\n}", "wrong argument count"},
		{"zero timeout", "permits 1\nredis {\nread_timeout 0s\n}", "read_timeout must be positive"},
		{"unknown reason", "permits 1\nreject slow {\nstatus 500\n}", "reject: unknown reason 'slow'"},
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
