package caddyfairqueue

import (
	"cmp"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
)

// Redis deployment modes (RedisConfig.Mode).
const (
	// ModeStandalone is one Redis server (perhaps with replicas that the
	// queue does not use).
	ModeStandalone = "standalone"
	// ModeSentinel is a master found through Redis Sentinel, followed
	// across failovers.
	ModeSentinel = "sentinel"
	// ModeCluster is a Redis Cluster.
	ModeCluster = "cluster"
)

// RedisConfig says where the shared state of the queues lives. Every
// Caddy instance whose handlers name the same Redis, database, key
// prefix and queue name shares that queue's permits and order.
//
// No error or log ever shows a password: errors about a URL leave the
// URL out, and the identity that tells two clients apart holds a hash.
type RedisConfig struct {
	// Mode is the kind of Redis deployment: "standalone" (one server,
	// given by URL or one address), "sentinel" (a master named by
	// MasterName, found through the Sentinels at Addresses and followed
	// across failovers) or "cluster" (a Redis Cluster reached through the
	// seed nodes at Addresses; each queue's keys share one hash tag, so
	// a queue lives in one slot). It is explicit, never guessed from the
	// number of addresses. Default "standalone".
	Mode string `json:"mode,omitempty"`

	// URL of a standalone Redis server: redis://[user:pass@]host:port/db,
	// rediss://... for TLS, or unix:///path/to/socket. Mutually
	// exclusive with Addresses, and only for mode standalone. Username,
	// Password, DB and TLS, when set, override the URL's parts.
	// Placeholders that are known at load time, such as {env.REDIS_URL},
	// are replaced. The query may set more go-redis client options
	// (e.g. ?protocol=3: the client speaks RESP2 by default).
	URL string `json:"url,omitempty"`

	// Addresses (host:port): with mode standalone the one server (default
	// 127.0.0.1:6379 when URL is empty too); with sentinel the Sentinels;
	// with cluster the seed nodes. Required with sentinel and cluster.
	// Load-time placeholders are replaced.
	Addresses []string `json:"addresses,omitempty"`

	// MasterName is the name of the master the Sentinels monitor.
	// Required with mode sentinel, and only for it.
	MasterName string `json:"master_name,omitempty"`

	// Username for Redis ACL authentication (AUTH username password).
	// Load-time placeholders are replaced.
	Username string `json:"username,omitempty"`

	// Password for Redis authentication. Use a placeholder such as
	// {env.REDIS_PASSWORD} to keep it out of the config; it is replaced
	// when the config is loaded.
	Password string `json:"password,omitempty"`

	// SentinelUsername is the ACL user for the Sentinels themselves
	// (mode sentinel), when they require one. Load-time placeholders are
	// replaced.
	SentinelUsername string `json:"sentinel_username,omitempty"`

	// SentinelPassword authenticates to the Sentinels themselves (mode
	// sentinel), when they require it; Password is for the master. Use a
	// placeholder such as {env.SENTINEL_PASSWORD}.
	SentinelPassword string `json:"sentinel_password,omitempty"`

	// DB is the database number (SELECT). Default 0; must be 0 with mode
	// cluster.
	DB int `json:"db,omitempty"`

	// TLS connects with TLS (minimum TLS 1.2, the server name taken from
	// the address). A rediss:// URL implies it.
	TLS bool `json:"tls,omitempty"`

	// KeyPrefix starts the name of every key of every queue, so that
	// several applications can share one Redis. Placeholders such as
	// {env.DEPLOYMENT} are replaced at load. Default "fair_queue".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// DialTimeout bounds connecting to Redis, one dial per connection
	// attempt. Default 500ms, at least 1ms. Short timeouts keep a frozen Redis from
	// holding requests: the request that finds Redis unreachable makes
	// at most two calls (the queue tries a failed call once more), each
	// retried once by the client when it could not connect, so it waits at most about four times
	// this where connecting hangs (a refused connection fails at once)
	// before on_store_error applies; the next requests do not wait.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// ReadTimeout bounds waiting for a reply from Redis. Default 500ms;
	// at least 1ms.
	ReadTimeout caddy.Duration `json:"read_timeout,omitempty"`

	// WriteTimeout bounds sending a command to Redis. Default 500ms; at
	// least 1ms.
	WriteTimeout caddy.Duration `json:"write_timeout,omitempty"`
}

// checkMode is the rule of RedisConfig.Mode (set, not defaulted).
func checkMode(mode string) error {
	if msg := oneOf(mode, ModeStandalone, ModeSentinel, ModeCluster); msg != "" {
		return redisErr("mode", msg)
	}
	return nil
}

// redisErr is the error of the redis block's option (JSON:
// redis.<option>; the caller adds redis): "redis: <option> <msg>".
func redisErr(option, msg string) error {
	return optErr("redis: "+option+" "+msg, option, msg)
}

// check validates the fields whose rules do not depend on placeholders
// (a URL with placeholders is checked once replaced, by newRedisBackend);
// errors name the option and never show a secret.
func (cfg *RedisConfig) check() error {
	mode := cmp.Or(cfg.Mode, ModeStandalone)
	if err := checkMode(mode); err != nil {
		return err
	}
	switch {
	case cfg.URL != "" && len(cfg.Addresses) > 0:
		return optErr("redis: url and address are mutually exclusive", "", "url and addresses are mutually exclusive")
	case cfg.URL != "" && mode != ModeStandalone:
		return optErr(fmt.Sprintf("redis: url is for mode %s only; give the %s addresses with address", ModeStandalone, mode),
			"url", fmt.Sprintf("is for mode %s only; give the %s addresses in addresses", ModeStandalone, mode))
	case mode == ModeStandalone && len(cfg.Addresses) > 1:
		msg := fmt.Sprintf("mode %s takes one address, got %d (set mode %s or %s for several)", ModeStandalone, len(cfg.Addresses), ModeCluster, ModeSentinel)
		return optErr("redis: "+msg, "addresses", msg)
	case mode != ModeStandalone && len(cfg.Addresses) == 0:
		msg := fmt.Sprintf("mode %s needs at least one address", mode)
		return optErr("redis: "+msg, "addresses", msg)
	case mode == ModeSentinel && cfg.MasterName == "":
		return optErr(fmt.Sprintf("redis: mode %s needs master_name", ModeSentinel), "master_name", fmt.Sprintf("is required with mode %s", ModeSentinel))
	case mode != ModeSentinel && cfg.MasterName != "":
		return redisErr("master_name", fmt.Sprintf("is for mode %s only", ModeSentinel))
	case mode != ModeSentinel && (cfg.SentinelUsername != "" || cfg.SentinelPassword != ""):
		field := "sentinel_password"
		if cfg.SentinelUsername != "" {
			field = "sentinel_username"
		}
		return optErr(fmt.Sprintf("redis: sentinel_username and sentinel_password are for mode %s only", ModeSentinel),
			field, fmt.Sprintf("is for mode %s only", ModeSentinel))
	case mode == ModeCluster && cfg.DB != 0:
		return redisErr("db", fmt.Sprintf("must be 0 with mode %s, got %d", ModeCluster, cfg.DB))
	case cfg.DB < 0:
		return redisErr("db", fmt.Sprintf("must be >= 0, got %d", cfg.DB))
	}
	for _, t := range []struct {
		name string
		v    caddy.Duration
	}{{"dial_timeout", cfg.DialTimeout}, {"read_timeout", cfg.ReadTimeout}, {"write_timeout", cfg.WriteTimeout}} {
		if t.v < 0 {
			return redisErr(t.name, fmt.Sprintf("must be > 0, got %s", time.Duration(t.v)))
		}
		if t.v > 0 && time.Duration(t.v) < minDuration { // 0: the default
			return redisErr(t.name, fmt.Sprintf("must be at least %s, got %s", minDuration, time.Duration(t.v)))
		}
	}
	if cfg.URL != "" {
		return checkRedisURL(cfg.URL)
	}
	return nil
}

// checkRedisURL is the rule of url alone: a URL go-redis reads, unless
// it holds a placeholder (replaced at load).
func checkRedisURL(s string) error {
	if strings.Contains(s, "{") {
		return nil
	}
	_, err := parseRedisURL(s)
	return urlErr(err)
}

// urlErr is an error of parseRedisURL as url's (JSON: redis.url).
func urlErr(err error) error {
	if err == nil {
		return nil
	}
	return optErr(err.Error(), "url", strings.TrimPrefix(err.Error(), "redis: "))
}

// redisBackend is a resolved RedisConfig.
type redisBackend struct {
	mode             string
	opts             redis.Options // the client's options; Addr unused but with standalone
	addrs            []string      // Sentinels or cluster seed nodes
	master           string        // sentinel master name
	sentinelUser     string
	sentinelPassword string
	prefix           string
	urlHash          string // the URL's query may hold more client options
	clientID         string // the go-redis client's identity in the clients pool (clientIdentity)
}

func newRedisBackend(cfg *RedisConfig, repl *caddy.Replacer) (*redisBackend, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	expand := func(s string) string { return repl.ReplaceKnown(s, "") }
	b := &redisBackend{mode: cfg.Mode, prefix: expand(cfg.KeyPrefix), master: expand(cfg.MasterName)}
	if cfg.MasterName != "" && b.master == "" {
		return nil, atLoad(redisErr("master_name", "is empty once its placeholders are replaced"))
	}
	if cfg.KeyPrefix != "" && b.prefix == "" {
		// Not the default prefix: the queues of every deployment whose
		// variable is unset would be one.
		return nil, atLoad(redisErr("key_prefix", "is empty once its placeholders are replaced"))
	}
	for i, a := range cfg.Addresses {
		if expand(a) == "" {
			return nil, atLoad(optErr("redis: an address is empty once its placeholders are replaced", "addresses["+strconv.Itoa(i)+"]",
				"is empty once its placeholders are replaced"))
		}
	}
	if b.mode == "" {
		b.mode = ModeStandalone
	}
	if b.prefix == "" {
		b.prefix = redisstore.DefaultKeyPrefix
	}
	o := &b.opts
	switch {
	case cfg.URL != "":
		u := expand(cfg.URL)
		parsed, err := parseRedisURL(u)
		if err != nil {
			return nil, atLoad(urlErr(err)) // one without placeholders was refused by check
		}
		*o = *parsed
		b.urlHash = urlOptionsHash(u)
	case b.mode != ModeStandalone:
		for _, a := range cfg.Addresses {
			b.addrs = append(b.addrs, expand(a))
		}
		o.Network = "tcp"
	case len(cfg.Addresses) == 1:
		o.Network, o.Addr = "tcp", expand(cfg.Addresses[0])
	default:
		o.Network, o.Addr = "tcp", "127.0.0.1:6379"
	}
	if cfg.DB != 0 {
		o.DB = cfg.DB
	}
	if cfg.Username != "" {
		o.Username = expand(cfg.Username)
	}
	if cfg.Password != "" {
		o.Password = expand(cfg.Password)
	}
	b.sentinelUser, b.sentinelPassword = expand(cfg.SentinelUsername), expand(cfg.SentinelPassword)
	if cfg.TLS && o.TLSConfig == nil {
		o.TLSConfig = &tls.Config{}
	}
	if o.TLSConfig != nil {
		o.TLSConfig.MinVersion = tls.VersionTLS12
	}
	for _, t := range []struct {
		cfg caddy.Duration
		dst *time.Duration
		def time.Duration
	}{
		{cfg.DialTimeout, &o.DialTimeout, redisstore.DefaultDialTimeout},
		{cfg.ReadTimeout, &o.ReadTimeout, redisstore.DefaultReadTimeout},
		{cfg.WriteTimeout, &o.WriteTimeout, redisstore.DefaultWriteTimeout},
	} {
		switch {
		case t.cfg > 0:
			*t.dst = time.Duration(t.cfg)
		case *t.dst <= 0: // neither set here nor in the URL's query
			*t.dst = t.def
		}
	}
	o.MaxRetries = redisstore.DefaultMaxRetries
	// One dial per connection attempt: go-redis's default dials 5 times,
	// 100ms apart, so a request that met a dead Redis waited about 0.8s
	// however short dial_timeout was. The call's own retry (MaxRetries)
	// dials once more (see DialTimeout for the bound).
	o.DialerRetries = 1
	o.ContextTimeoutEnabled = true
	if o.Protocol == 0 {
		// RESP2 unless the URL asks for 3 (?protocol=3): the queue reads
		// no RESP3 type, and go-redis checks every RESP3 reply for
		// pending push notifications first (about 7 us of CPU per call
		// here, two calls per request).
		o.Protocol = 2
	}
	quietHandshake(o)
	b.clientID = b.clientIdentity()
	return b, nil
}

// parseRedisURL is redis.ParseURL without echoing the URL (and its
// password) in errors.
func parseRedisURL(s string) (*redis.Options, error) {
	if !strings.Contains(s, "://") && !strings.HasPrefix(s, "unix:") {
		// An address (127.0.0.1:6379), as redis-cli takes it: Go's URL
		// parser's words for it ("first path segment in URL cannot
		// contain colon", "invalid URL scheme: localhost") do not say
		// what to write.
		return nil, errors.New("redis: invalid url: no scheme: write redis://host:port/db (rediss:// for TLS, unix:///path for a socket)")
	}
	o, err := redis.ParseURL(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("redis: invalid url: %s", hidePassword(s, err.Error()))
	}
	return o, nil
}

// hidePassword is msg, the parsers' error of url s, or, where msg quotes
// a part of the user or password of s, words that quote none: a '/',
// '?', '#' or '@' of a password not percent-encoded ends it early, and
// what follows reads as the port, the path (the db) or the query, which
// the parsers quote.
func hidePassword(s, msg string) string {
	start, at := strings.Index(s, "://"), strings.LastIndexByte(s, '@')
	if start < 0 || at < start {
		return msg // no user or password
	}
	parts := strings.FieldsFunc(s[start+len("://"):at], func(r rune) bool { return strings.ContainsRune(":/?#@", r) })
	for _, part := range parts {
		if len(part) > 1 && strings.Contains(msg, part) {
			return "it does not parse (the parser's words are left out: they quote a part of its password); " +
				"percent-encode a '/', '?', '#', '@' or ':' of the password (%2F, %3F, %23, %40, %3A)"
		}
	}
	return msg
}

// urlOptionsHash identifies the client options of a URL's query (the
// rest of the URL, once parsed, is in clientIdentity already), so that
// two spellings of one URL (redis://h:1 and redis://h:1/0) are one
// client. "" without a query.
func urlOptionsHash(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.RawQuery == "" {
		return ""
	}
	return shortHash(u.Query().Encode()) // sorted by key
}

// servers names the servers the client dials first: the standalone
// server, or the Sentinels or seed nodes, sorted.
func (b *redisBackend) servers() string {
	if b.mode == ModeStandalone {
		return b.opts.Addr
	}
	return strings.Join(slices.Sorted(slices.Values(b.addrs)), ",")
}

// clientIdentity is the identity of the client: everything that
// configures it, with the passwords hashed.
func (b *redisBackend) clientIdentity() string {
	o := &b.opts
	return fmt.Sprintf("redis|%s|%s:%s|master=%s|db=%d|user=%s|pw=%s|suser=%s|spw=%s|tls=%t|timeouts=%s/%s/%s|url=%s",
		b.mode, o.Network, b.servers(), b.master, o.DB, o.Username, shortHash(o.Password),
		b.sentinelUser, shortHash(b.sentinelPassword), o.TLSConfig != nil,
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, b.urlHash)
}

// shortHash identifies a secret without revealing it ("" stays "").
func shortHash(s string) string {
	if s == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

func (b *redisBackend) storeID() string { return b.clientID + "|prefix=" + b.prefix }

func (b *redisBackend) dataID() string {
	// The prefix as it stands in the keys ("{<prefix>:<name>}", braces
	// replaced): prefixes a brace apart write the same keys.
	tag := redisstore.TagOf(b.prefix, "")
	return b.database() + "|prefix=" + strings.TrimSuffix(strings.TrimPrefix(tag, "{"), ":}")
}

// database identifies the Redis database the store uses: its servers
// and DB number.
func (b *redisBackend) database() string {
	where := b.servers()
	switch b.mode {
	case ModeSentinel:
		where = "sentinel:" + b.master + "@" + where
	case ModeCluster:
		where = "cluster:" + where
	}
	return fmt.Sprintf("redis|%s|db=%d", where, b.opts.DB)
}

// queueKey is the database and the queue's hash tag, which holds the
// prefix too: names a brace apart are one queue, and so are a prefix and
// a name a colon apart ("edge" with "eu:team", "edge:eu" with "team").
func (b *redisBackend) queueKey(name string) string {
	return b.database() + "|" + redisstore.TagOf(b.prefix, name)
}

func (b *redisBackend) describe() storeDesc {
	d := storeDesc{Store: "redis", Mode: b.mode, Address: b.servers(), Master: b.master, DB: b.opts.DB, KeyPrefix: b.prefix}
	if b.opts.Network == "unix" {
		d.Address = "unix:" + d.Address
	}
	return d
}

func (b *redisBackend) open(name string) (fairqueue.Store, func(), error) {
	rdb, release, err := b.client()
	if err != nil {
		return nil, nil, err
	}
	return redisstore.New(rdb, name, redisstore.Options{KeyPrefix: b.prefix}), release, nil
}

// client takes a reference to the backend's go-redis client, shared
// through the clients pool; release drops it.
func (b *redisBackend) client() (rdb redis.UniversalClient, release func(), err error) {
	v, _, err := clients.LoadOrNew(b.clientID, func() (caddy.Destructor, error) {
		return &redisClient{rdb: b.newClient()}, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return v.(*redisClient).rdb, func() { _, _ = clients.Delete(b.clientID) }, nil
}

// newClient makes the go-redis client of the mode, with the same short
// timeouts and bounded retries in every mode; it connects lazily, at the
// first command.
func (b *redisBackend) newClient() redis.UniversalClient {
	routeRedisLogs.Do(func() { redis.SetLogger(newRedisLogger(time.Now)) })
	o := b.opts
	if b.mode == ModeStandalone {
		return redis.NewClient(&o)
	}
	u := redis.UniversalOptions{
		Addrs: b.addrs, MasterName: b.master, SentinelUsername: b.sentinelUser, SentinelPassword: b.sentinelPassword,
		Username: o.Username, Password: o.Password, DB: o.DB, TLSConfig: o.TLSConfig,
		DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
		MaxRetries: o.MaxRetries, DialerRetries: o.DialerRetries, ContextTimeoutEnabled: o.ContextTimeoutEnabled,
		Protocol: o.Protocol, DisableIdentity: o.DisableIdentity,
	}
	if b.mode == ModeSentinel {
		return redis.NewFailoverClient(u.Failover()) // which sends no MAINT_NOTIFICATIONS
	}
	co := u.Cluster()
	co.MaintNotificationsConfig = o.MaintNotificationsConfig
	return redis.NewClusterClient(co)
}

// quietHandshake keeps go-redis from sending, on each connection it
// opens, the commands of its handshake that the ACL of the queue
// (redisstore.ACLRules) does not grant: CLIENT SETINFO (the library's
// name and version, Redis 7.2 and later) and CLIENT MAINT_NOTIFICATIONS
// (RESP3). A Redis that knows them would refuse each, and write an
// ACL LOG entry per connection; the queue needs neither.
func quietHandshake(o *redis.Options) {
	o.DisableIdentity = true
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// clients shares one go-redis client per client identity across queue
// names and config reloads; the last user closes it.
var clients = caddy.NewUsagePool()

// redisClient is a pooled go-redis client.
type redisClient struct {
	rdb redis.UniversalClient
}

// Destruct closes the client once no engine uses it.
func (c *redisClient) Destruct() error { return c.rdb.Close() }
