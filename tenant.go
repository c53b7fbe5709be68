package caddyfairqueue

import (
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// fairRequest resolves the request's tenant, weight, cost and priority
// for the engine, and sets the tenant placeholder. A handler without
// Tenant and Priority queues every request in strict FIFO order: the
// zero Request.
func (h *Handler) fairRequest(repl *caddy.Replacer, bodyLen int, info bodyInfo) fairqueue.Request {
	if !h.fair() {
		return fairqueue.Request{}
	}
	var req fairqueue.Request
	if h.Tenant != "" {
		req.Tenant = tenantValue(repl.ReplaceAll(h.Tenant, ""))
		req.Weight = h.weight(repl, req.Tenant)
		repl.Set(phTenant, fairqueue.TenantKey(req.Tenant))
	}
	if h.Priority != "" {
		req.Priority = priorityBand(repl.ReplaceAll(h.Priority, ""))
	}
	req.Cost = h.requestCost(bodyLen, info)
	return req
}

// tenantValue cuts a tenant value to maxTenantLen bytes, so that the
// hash (and a weight lookup) of a huge header costs no more than that.
func tenantValue(v string) string {
	if len(v) > maxTenantLen {
		return v[:maxTenantLen]
	}
	return v
}

// weight is the tenant's weight: its entry in Weights, else the
// weight placeholder's number bounded to [minWeight, maxWeight], else 1.
func (h *Handler) weight(repl *caddy.Replacer, tenant string) float64 {
	if w, ok := h.Weights[tenant]; ok {
		return w
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
