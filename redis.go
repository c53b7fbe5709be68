package caddyfairqueue

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
)

// RedisConfig says where the shared state of the queues lives. Every
// Caddy instance whose handlers name the same Redis, database, key
// prefix and queue name shares that queue's permits and order.
type RedisConfig struct {
	// URL of a single Redis server: redis://[user:pass@]host:port/db,
	// rediss://... for TLS, or unix:///path/to/socket. Mutually
	// exclusive with Addresses. Username, Password, DB and TLS, when
	// set, override the URL's parts. Placeholders that are known at
	// load time, such as {env.REDIS_URL}, are replaced.
	URL string `json:"url,omitempty"`

	// Addresses (host:port) of the Redis server. One address is a single
	// server; more than one are the seed nodes of a Redis Cluster (each
	// queue's keys share one hash tag, so a queue lives in one slot).
	// Mutually exclusive with URL. Default: 127.0.0.1:6379 when URL is
	// empty too. Load-time placeholders are replaced.
	Addresses []string `json:"addresses,omitempty"`

	// Username for Redis ACL authentication (AUTH username password).
	// Load-time placeholders are replaced.
	Username string `json:"username,omitempty"`

	// Password for Redis authentication. Use a placeholder such as
	// {env.REDIS_PASSWORD} to keep it out of the config; it is replaced
	// when the config is loaded.
	Password string `json:"password,omitempty"`

	// DB is the database number (SELECT). Default 0; must be 0 with a
	// Redis Cluster.
	DB int `json:"db,omitempty"`

	// TLS connects with TLS (minimum TLS 1.2, the server name taken from
	// the address). A rediss:// URL implies it.
	TLS bool `json:"tls,omitempty"`

	// KeyPrefix starts the name of every key of every queue, so that
	// several applications can share one Redis. Default "fair_queue".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// DialTimeout bounds connecting to Redis. Default 500ms. Short
	// timeouts keep a frozen Redis from holding requests: see
	// on_store_error.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// ReadTimeout bounds waiting for a reply from Redis. Default 500ms.
	ReadTimeout caddy.Duration `json:"read_timeout,omitempty"`

	// WriteTimeout bounds sending a command to Redis. Default 500ms.
	WriteTimeout caddy.Duration `json:"write_timeout,omitempty"`
}

// backend is where a handler's queues live. Two handlers whose backends
// have the same key share engines (and so waiting tickets and permits
// survive a config reload); two whose backends have the same location
// read and write the same queues.
//
// Only Redis exists today; an in-process store will be a second
// implementation, made by newStore.
type backend interface {
	// key identifies the store's whole client configuration; it holds
	// no secret.
	key() string
	// location identifies the data the store reads and writes: equal
	// locations and queue names are one queue.
	location() string
	// open returns the store of queue name and a func that frees what
	// open acquired. It makes no network call.
	open(name string) (fairqueue.Store, func(), error)
}

// newStore resolves a handler's store configuration. It makes no
// network call; it is the one place that decides which kind of store a
// handler uses.
func newStore(cfg *RedisConfig, repl *caddy.Replacer) (backend, error) {
	if cfg == nil {
		return nil, errors.New("redis is required (local queue not yet available)")
	}
	return newRedisBackend(cfg, repl)
}

// redisBackend is a resolved RedisConfig.
type redisBackend struct {
	cluster bool
	opts    redis.Options // single server; Addr unused with cluster
	addrs   []string      // cluster seed nodes
	prefix  string
	urlSum  string // hash of the URL: its query may hold more client options
	ckey    string // client identity
}

func newRedisBackend(cfg *RedisConfig, repl *caddy.Replacer) (*redisBackend, error) {
	expand := func(s string) string { return repl.ReplaceKnown(s, "") }
	b := &redisBackend{prefix: cfg.KeyPrefix}
	if b.prefix == "" {
		b.prefix = redisstore.DefaultKeyPrefix
	}
	o := &b.opts
	switch {
	case cfg.URL != "" && len(cfg.Addresses) > 0:
		return nil, errors.New("redis: url and addresses are mutually exclusive")
	case cfg.URL != "":
		u := expand(cfg.URL)
		parsed, err := parseRedisURL(u)
		if err != nil {
			return nil, err
		}
		*o = *parsed
		b.urlSum = shortHash(u)
	case len(cfg.Addresses) > 1:
		b.cluster = true
		for _, a := range cfg.Addresses {
			b.addrs = append(b.addrs, expand(a))
		}
		o.Network = "tcp"
	case len(cfg.Addresses) == 1:
		o.Network, o.Addr = "tcp", expand(cfg.Addresses[0])
	default:
		o.Network, o.Addr = "tcp", "127.0.0.1:6379"
	}
	if b.cluster && cfg.DB != 0 {
		return nil, fmt.Errorf("redis: db must be 0 with a Redis Cluster (several addresses), got %d", cfg.DB)
	}
	if cfg.DB < 0 {
		return nil, fmt.Errorf("redis: db must be >= 0, got %d", cfg.DB)
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
	if cfg.TLS && o.TLSConfig == nil {
		o.TLSConfig = &tls.Config{}
	}
	if o.TLSConfig != nil {
		o.TLSConfig.MinVersion = tls.VersionTLS12
	}
	for _, t := range []struct {
		name string
		cfg  caddy.Duration
		dst  *time.Duration
		def  time.Duration
	}{
		{"dial_timeout", cfg.DialTimeout, &o.DialTimeout, redisstore.DefaultDialTimeout},
		{"read_timeout", cfg.ReadTimeout, &o.ReadTimeout, redisstore.DefaultReadTimeout},
		{"write_timeout", cfg.WriteTimeout, &o.WriteTimeout, redisstore.DefaultWriteTimeout},
	} {
		switch {
		case t.cfg < 0:
			return nil, fmt.Errorf("redis: %s must be > 0, got %s", t.name, time.Duration(t.cfg))
		case t.cfg > 0:
			*t.dst = time.Duration(t.cfg)
		case *t.dst <= 0: // neither set here nor in the URL's query
			*t.dst = t.def
		}
	}
	o.MaxRetries = redisstore.DefaultMaxRetries
	o.ContextTimeoutEnabled = true
	b.ckey = b.clientKey()
	return b, nil
}

// parseRedisURL is redis.ParseURL without echoing the URL (and its
// password) in errors.
func parseRedisURL(s string) (*redis.Options, error) {
	o, err := redis.ParseURL(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("redis: invalid url: %v", err)
	}
	return o, nil
}

// clientKey is the identity of the client: everything that configures
// it, with the password hashed.
func (b *redisBackend) clientKey() string {
	o := &b.opts
	mode, addrs := "single", []string{o.Network + ":" + o.Addr}
	if b.cluster {
		mode, addrs = "cluster", slices.Sorted(slices.Values(b.addrs))
	}
	return fmt.Sprintf("redis|%s|%s|db=%d|user=%s|pw=%s|tls=%t|timeouts=%s/%s/%s|url=%s",
		mode, strings.Join(addrs, ","), o.DB, o.Username, shortHash(o.Password), o.TLSConfig != nil,
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, b.urlSum)
}

// shortHash identifies a secret without revealing it ("" stays "").
func shortHash(s string) string {
	if s == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

func (b *redisBackend) key() string { return b.ckey + "|prefix=" + b.prefix }

func (b *redisBackend) location() string {
	addrs := []string{b.opts.Addr}
	if b.cluster {
		addrs = slices.Sorted(slices.Values(b.addrs))
	}
	return fmt.Sprintf("redis|%s|db=%d|prefix=%s", strings.Join(addrs, ","), b.opts.DB, b.prefix)
}

func (b *redisBackend) open(name string) (fairqueue.Store, func(), error) {
	v, _, err := clients.LoadOrNew(b.ckey, func() (caddy.Destructor, error) {
		return &redisClient{rdb: b.newClient()}, nil
	})
	if err != nil {
		return nil, nil, err
	}
	st := redisstore.New(v.(*redisClient).rdb, name, redisstore.Options{KeyPrefix: b.prefix})
	release := func() { _, _ = clients.Delete(b.ckey) }
	return st, release, nil
}

// newClient makes the go-redis client; it connects lazily, at the first
// command.
func (b *redisBackend) newClient() redis.UniversalClient {
	o := b.opts
	if !b.cluster {
		return redis.NewClient(&o)
	}
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 b.addrs,
		Username:              o.Username,
		Password:              o.Password,
		TLSConfig:             o.TLSConfig,
		DialTimeout:           o.DialTimeout,
		ReadTimeout:           o.ReadTimeout,
		WriteTimeout:          o.WriteTimeout,
		MaxRetries:            o.MaxRetries,
		ContextTimeoutEnabled: o.ContextTimeoutEnabled,
	})
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
