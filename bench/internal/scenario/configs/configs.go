// Package configs runs the config scenario: the saturated load against
// each fair_queue topology configured by the bench's JSON and by an
// operator's Caddyfile, alternated round by round. Its figures and their
// report are report.Configs.
package configs

import (
	"context"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

// configSpecs are the config scenario's systems: HAProxy, then each
// fair_queue topology of the main run once with the bench's JSON and
// once with a Caddyfile.
func configSpecs() []systems.Spec {
	specs := []systems.Spec{{Name: "haproxy", Label: "HAProxy maxconn", Kind: systems.KindHAProxy, Nodes: 1}}
	for _, s := range systems.DefaultSpecs() {
		if s.Kind != systems.KindFairQueue {
			continue
		}
		cf := s
		cf.Name, cf.Label, cf.Caddyfile = s.Name+"-cf", s.Label+" (Caddyfile)", true
		specs = append(specs, s, cf)
	}
	return specs
}

// Run runs the config scenario: rounds of the saturated load, the
// systems' order rotating each round.
func Run(ctx context.Context, b *scenario.Runner) {
	set := b.Res.Settings
	rounds := 5
	if b.Quick {
		rounds = 2 // only when asked for (-systems configs)
	}
	cs := &report.Configs{Rounds: rounds}
	b.Res.Configs = cs
	b.Logf("== configs: bench JSON vs Caddyfile, %d rounds of the saturated load (%.0f s each), alternated", rounds, set.SaturatedS)
	var running []*systems.Running
	defer func() {
		for _, r := range running {
			if r != nil {
				b.Env.Stop(r)
			}
		}
	}()
	for _, spec := range configSpecs() {
		sys := &report.ConfigSystem{Spec: spec}
		cs.Systems = append(cs.Systems, sys)
		r, err := b.Env.Start(ctx, spec)
		if err == nil {
			err = b.Warm(ctx, r)
		}
		if err != nil {
			sys.Error = err.Error()
			b.Logf("   %s not measured: %v", spec.Label, err)
		}
		running = append(running, r)
	}
	cfg := loadgen.Config{Clients: set.Clients, Duration: report.Secs(set.SaturatedS), Tokens: 1, Delay: report.MS(set.ServiceMS)}
	for round := range rounds {
		n := len(cs.Systems)
		for k := range n {
			i := (k + round) % n
			sys, r := cs.Systems[i], running[i]
			if sys.Error != "" || r == nil {
				continue
			}
			if ctx.Err() != nil {
				return
			}
			run, err := b.Measure(ctx, r, cfg)
			if err != nil {
				sys.Error = err.Error()
				b.Logf("   %s failed: %v", sys.Spec.Label, err)
				continue
			}
			sys.Runs = append(sys.Runs, run)
			b.Logf("   round %d %-34s %8.1f ok/s  p50 %6.2f ms  handoff p50 %.3f ms  upstream max %d  CPU/req %.4f ms",
				round+1, sys.Spec.Label, run.Throughput, run.P50, run.HandoffP50, run.UpstreamMax, run.ProxyCPUPerRequest)
		}
	}
	cs.SetRatios()
}
