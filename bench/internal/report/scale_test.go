package report

import (
	"strings"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
)

func TestHandoffOK(t *testing.T) {
	for _, tc := range []struct {
		base, deep float64
		want       bool
	}{
		{2, 2, true},
		{2, 3, true},     // +1 ms allowed
		{2, 3.01, false}, // more than both 1.25x (2.5) and +1 (3)
		{8, 10, true},    // 1.25x
		{8, 10.1, false},
		{0.5, 1.4, true},
		{6, 1, true},
	} {
		if got := handoffOK(tc.base, tc.deep, 1.25, 1); got != tc.want {
			t.Errorf("handoffOK(%v, %v) = %v, want %v", tc.base, tc.deep, got, tc.want)
		}
	}
}

func TestScaleChecks(t *testing.T) {
	good := func() *Scale {
		return &Scale{
			Settings: DefaultScaleSettings(50_000, 20_000),
			Queued:   50_000, RSSPerWaiterKiB: 30, RedisPerWaiterKiB: 0.5,
			BaseCmdsPerS: 300, IdleCmdsPerS: 305,
			HandoffBase:     &Handoffs{Count: 1500, P50: 1.6, P99: 6},
			HandoffDeep:     &Handoffs{Count: 1500, P50: 1.7, P99: 7},
			UpstreamMaxHeld: 4, UpstreamMaxFlow: 4,
			Queues: &ScaleQueues{Queues: 100, OneCmdsPerS: 100, ManyCmdsPerS: 10_000, OneMem: 20 << 10, ManyMem: 2 << 20},
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*Scale)
		want   map[string]string // target -> result
	}{
		{name: "all pass", change: func(*Scale) {},
			want: map[string]string{TargetScaleMem: "pass", TargetIdle: "pass", TargetScaleHandoff: "pass",
				TargetConcurrency: "pass", TargetScaleFailures: "pass", TargetScaleQueues: "n/a"}},
		{name: "too much memory", change: func(s *Scale) { s.RSSPerWaiterKiB = 49.8 },
			want: map[string]string{TargetScaleMem: "FAIL"}},
		{name: "short of 50,000", change: func(s *Scale) { s.Queued = 30_000; s.Note = "the queue stopped growing" },
			want: map[string]string{TargetScaleMem: "FAIL", TargetIdle: "pass"}},
		{name: "nothing queued", change: func(s *Scale) { s.Queued = 0 },
			want: map[string]string{TargetScaleMem: "FAIL", TargetIdle: ""}},
		{name: "idle load grows", change: func(s *Scale) { s.IdleCmdsPerS = 500 },
			want: map[string]string{TargetIdle: "FAIL"}},
		{name: "handoff worse", change: func(s *Scale) { s.HandoffDeep.P99 = 7.6 },
			want: map[string]string{TargetScaleHandoff: "FAIL"}},
		{name: "handoff not measured", change: func(s *Scale) { s.HandoffDeep = nil },
			want: map[string]string{TargetScaleHandoff: "FAIL"}},
		{name: "served without a permit", change: func(s *Scale) { s.Served = 1 },
			want: map[string]string{TargetConcurrency: "FAIL"}},
		{name: "upstream over permits while draining", change: func(s *Scale) { s.UpstreamMaxFlow = 5 },
			want: map[string]string{TargetConcurrency: "FAIL"}},
		{name: "a failure", change: func(s *Scale) { s.Failed = 1 },
			want: map[string]string{TargetScaleFailures: "FAIL"}},
		{name: "queues failed", change: func(s *Scale) { s.Queues.Queues = 40; s.Queues.Note = "too many queues" },
			want: map[string]string{TargetScaleQueues: "FAIL"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.change(s)
			got := map[string]string{}
			for _, c := range scaleChecks(s, 4) {
				if prev, ok := got[c.Target]; ok && prev == "FAIL" {
					continue // a FAIL of a target stays
				}
				got[c.Target] = c.Result
			}
			for target, want := range tc.want {
				if got[target] != want {
					t.Errorf("%s: %q, want %q (all: %v)", target, got[target], want, got)
				}
			}
		})
	}
	if scaleChecks(nil, 4) != nil {
		t.Error("checks without a scale run")
	}
}

func TestTopCommands(t *testing.T) {
	cs := procs.CommandStats{"evalsha": 50, "zcard": 50, "info": 900, "publish": 10, "ping": 1}
	for _, tc := range []struct {
		n    int
		want string
	}{
		{2, "evalsha 50, zcard 50"},
		{10, "evalsha 50, zcard 50, publish 10, ping 1"},
	} {
		if got := topCommands(cs, tc.n); got != tc.want {
			t.Errorf("topCommands(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
	if got := topCommands(nil, 3); got != "no command" {
		t.Errorf("topCommands(nil) = %q", got)
	}
}

func TestScaleMarkdown(t *testing.T) {
	var b strings.Builder
	scaleMarkdown(&b, &Scale{Settings: DefaultScaleSettings(50_000, 20_000), Queued: 50_000,
		HandoffBase: &Handoffs{P99: 6}, Queues: &ScaleQueues{Queues: 100}})
	out := b.String()
	for _, want := range []string{"## Scale: 50000 waiters over 3 nodes", "| 50100 |", "100 queues on one node", "{http.request.header.X-Queue}"} {
		if !strings.Contains(out, want) {
			t.Errorf("markdown lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	scaleMarkdown(&b, nil)
	if b.Len() != 0 {
		t.Error("a section without a scale run")
	}
}

func TestHandoffsCPULine(t *testing.T) {
	h := &Handoffs{MachineBusy: 0.475, CaddyCores: 0.5, RedisCores: 0.1}
	if got, want := h.CPULine(), "machine 48% busy, Caddy 0.50 cores, Redis 0.10"; got != want {
		t.Errorf("cpuLine = %q, want %q", got, want)
	}
	h.ClientCores, h.RedisRTTP50, h.RedisRTTP99 = 0.2, 0.1, 0.9
	if got, want := h.CPULine(), "machine 48% busy, Caddy 0.50 cores, Redis 0.10, clients 0.20; Redis round trip p50 0.100 ms, p99 0.900 ms"; got != want {
		t.Errorf("cpuLine = %q, want %q", got, want)
	}
}

func TestClientProcs(t *testing.T) {
	for _, tc := range []struct {
		total, nodes, perProc, want int
	}{
		{50_000, 3, 18_000, 3},
		{50_000, 3, 16_000, 6}, // 4 would do, but each node gets as many
		{100, 3, 18_000, 3},
		{54_001, 3, 18_000, 6},
		{54_000, 3, 18_000, 3},
		{10, 1, 4, 3},
		{0, 3, 18_000, 3},
	} {
		if got := clientProcs(tc.total, tc.nodes, tc.perProc); got != tc.want {
			t.Errorf("clientProcs(%d, %d, %d) = %d, want %d", tc.total, tc.nodes, tc.perProc, got, tc.want)
		}
	}
}
