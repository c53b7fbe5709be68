package caddyfairqueue

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
)

// fairRequest resolves the request's tenant, weight, cost and priority
// for the engine, and sets the tenant placeholder. A handler without
// Tenant and Priority queues every request in strict FIFO order: the
// zero Request.
func (h *Handler) fairRequest(repl *caddy.Replacer, info jsonscan.Fields) fairqueue.Request {
	if !h.fair() {
		return fairqueue.Request{}
	}
	var req fairqueue.Request
	if h.Tenant != "" {
		req.Tenant = tenantValue(repl.ReplaceAll(h.Tenant, ""))
		key := fairqueue.TenantKey(req.Tenant)
		req.Weight = h.weight(repl, req.Tenant, key)
		repl.Set(phTenant, key)
	}
	if h.Priority != "" {
		req.Priority = priorityBand(repl.ReplaceAll(h.Priority, ""))
	}
	req.Cost = h.requestCost(info)
	return req
}

// tenantValue cuts a tenant value to maxTenantLen bytes, so that the
// hash (and a weight lookup) of a huge header costs no more than that,
// and a copy, so that the request does not keep the whole value while
// it waits.
func tenantValue(v string) string {
	if len(v) > maxTenantLen {
		return strings.Clone(v[:maxTenantLen])
	}
	return v
}

// weightHashPrefix marks a Weights key that names a tenant by its key
// (the hash the logs, metrics and admin API show) rather than by its
// raw value, which may be a secret.
const weightHashPrefix = "sha256:"

// weightKey is the tenant key a Weights entry applies to: the key it
// names after weightHashPrefix (16 lowercase hex digits, as
// fairqueue.TenantKey writes it), or the key of the raw tenant value it
// is. A key holding a placeholder, such as sha256:{env.GOLD_TENANT_KEY},
// is checked once replaced at load (expandWeights): until then it is its
// text. Errors never echo the entry, which may be a secret.
func weightKey(entry string) (string, error) {
	key, hashed := strings.CutPrefix(entry, weightHashPrefix)
	if !hashed {
		if len(entry) > maxTenantLen {
			return "", weightErr(entry, fmt.Sprintf("a tenant value is longer than %d bytes (tenant values are cut there)", maxTenantLen))
		}
		return fairqueue.TenantKey(entry), nil
	}
	if !isTenantKey(key) && !strings.Contains(key, "{") {
		return "", errTenantKey(entry, key)
	}
	return key, nil
}

// errTenantKey is the error of entry, a malformed key after
// weightHashPrefix.
func errTenantKey(entry, key string) error {
	return weightErr(entry, fmt.Sprintf("a %s tenant key must be %d lowercase hex digits (the first %d of the value's SHA-256, "+
		"as logs and the admin API show it), got %d characters", weightHashPrefix, tenantKeyLen, tenantKeyLen, len(key)))
}

// weightErr is the error of the weight of entry, a tenant of Weights:
// "weight: <msg>" in a Caddyfile (whose line names it), and in JSON
// weights["sha256:<key>"] (a key, or a value with placeholders, as
// written), or, for a raw value, a secret never echoed, the key of it.
func weightErr(entry, msg string) error {
	return optErr("weight: "+msg, weightPath(entry), msg)
}

func weightPath(entry string) string {
	if strings.HasPrefix(entry, weightHashPrefix) || strings.Contains(entry, "{") {
		return "weights[" + strconv.Quote(entry) + "]"
	}
	return "weights[<the value of key " + weightHashPrefix + fairqueue.TenantKey(entry) + ">]"
}

// tenantKeyLen is the length of fairqueue.TenantKey's hex.
const tenantKeyLen = 16

func isTenantKey(s string) bool {
	if len(s) != tenantKeyLen {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// checkWeights is the rule of Handler.Weights: each key a tenant value
// or a well-formed hashed key, each tenant given once (not both as a
// value and by its key), each weight minWeight to maxWeight.
func checkWeights(weights map[string]float64) error {
	seen := make(map[string]bool, len(weights))
	for _, entry := range slices.Sorted(maps.Keys(weights)) { // an error names the same entry each load
		w := weights[entry]
		key, err := weightKey(entry)
		if err != nil {
			return err
		}
		if seen[key] {
			return weightErr(entry, fmt.Sprintf("tenant %s%s is given twice (by its value and by its key)", weightHashPrefix, key))
		}
		seen[key] = true
		if !(w >= minWeight && w <= maxWeight) {
			msg := fmt.Sprintf("must be %v to %v, got %v", minWeight, maxWeight, w)
			return optErr("weight "+msg, weightPath(entry), msg)
		}
	}
	return nil
}

// expandWeights replaces the placeholders known at load, such as
// {env.GOLD_KEY}, in the tenants of weights (a value or a key): a
// tenant kept out of the config in an environment variable. Errors
// never show a tenant, which may be a secret.
func expandWeights(weights map[string]float64, repl *caddy.Replacer) (map[string]float64, error) {
	if len(weights) == 0 {
		return weights, nil
	}
	out := make(map[string]float64, len(weights))
	for _, entry := range slices.Sorted(maps.Keys(weights)) { // an error names the same entry each load
		w := weights[entry]
		tenant := entry
		if strings.Contains(entry, "{") {
			if tenant = repl.ReplaceKnown(entry, ""); tenant == "" {
				return nil, atLoad(optErr("weight: a tenant is empty once its placeholders are replaced", weightPath(entry),
					"the tenant is empty once its placeholders are replaced"))
			}
		}
		if key, hashed := strings.CutPrefix(tenant, weightHashPrefix); hashed && !isTenantKey(key) {
			return nil, atLoad(errTenantKey(entry, key)) // one with a placeholder was let through before
		}
		if _, dup := out[tenant]; dup {
			return nil, atLoad(weightErr(entry, "a tenant is given twice once its placeholders are replaced"))
		}
		out[tenant] = w
	}
	return out, checkWeights(out)
}

// weight is the tenant's weight: its entry in Weights (by raw value or
// by key), else the weight placeholder's number bounded to [minWeight,
// maxWeight], else 1.
func (h *Handler) weight(repl *caddy.Replacer, tenant, key string) float64 {
	if len(h.Weights) > 0 {
		// A raw value that looks hashed is looked up only by its own key:
		// a client sending "sha256:<key>" is not the tenant of that key.
		if !strings.HasPrefix(tenant, weightHashPrefix) {
			if w, ok := h.Weights[tenant]; ok {
				return w
			}
		}
		var buf [len(weightHashPrefix) + tenantKeyLen]byte
		n := copy(buf[:], weightHashPrefix)
		copy(buf[n:], key)
		if w, ok := h.Weights[string(buf[:])]; ok { // no allocation
			return w
		}
	}
	if h.WeightPlaceholder == "" {
		return 1
	}
	w, err := strconv.ParseFloat(strings.TrimSpace(repl.ReplaceAll(h.WeightPlaceholder, "")), 64)
	if (err != nil && !errors.Is(err, strconv.ErrRange)) || math.IsNaN(w) {
		return 1
	}
	return min(max(w, minWeight), maxWeight)
}

// priorityBand reads a priority band: an integer clamped to
// 0..fairqueue.MaxPriority; anything else is band 0.
func priorityBand(v string) int {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil && !errors.Is(err, strconv.ErrRange) { // out of range: n is clamped
		return 0
	}
	return min(max(n, 0), fairqueue.MaxPriority)
}
