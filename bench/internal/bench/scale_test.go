package bench

import (
	"reflect"
	"strings"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
)

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

func TestPlanClients(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		total, nodes, procs, perPro int
		want                        []clientShare
		err                         string
	}{
		{name: "even", total: 50_000, nodes: 3, procs: 3, perPro: 18_000,
			want: []clientShare{{0, 16_667}, {1, 16_667}, {2, 16_666}}},
		{name: "two per node", total: 10, nodes: 2, procs: 4, perPro: 100,
			want: []clientShare{{0, 3}, {1, 3}, {0, 2}, {1, 2}}},
		{name: "process over the cap", total: 60_000, nodes: 3, procs: 3, perPro: 18_000, err: "client process 0 would hold 20000"},
		{name: "node over the cap", total: 60_000, nodes: 3, procs: 6, perPro: 18_000, err: "node 0 would hold 20000"},
		{name: "procs not a multiple of nodes", total: 100, nodes: 3, procs: 4, perPro: 18_000, err: "cannot split"},
		{name: "no node", total: 100, nodes: 0, procs: 3, perPro: 18_000, err: "cannot split"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := planClients(tc.total, tc.nodes, tc.procs, tc.perPro)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			sum := 0
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("share %d = %v, want %v", i, got[i], tc.want[i])
				}
				sum += got[i].Waiters
			}
			if sum != tc.total {
				t.Errorf("shares sum to %d, want %d", sum, tc.total)
			}
		})
	}
}

func TestScaleSettingsFitTheFileLimit(t *testing.T) {
	for _, tc := range []struct {
		waiters, fdLimit, wantProcs int
	}{
		{0, 20_000, 3},
		{50_000, 20_000, 3},
		{50_000, 10_000, 9}, // 8,000 each: 7, rounded up to a multiple of 3
		{2_000, 20_000, 3},
	} {
		s := scaleSettings(tc.waiters, tc.fdLimit)
		if s.ClientProcs != tc.wantProcs {
			t.Errorf("scaleSettings(%d, %d).ClientProcs = %d, want %d", tc.waiters, tc.fdLimit, s.ClientProcs, tc.wantProcs)
		}
		if _, err := planClients(s.Waiters, s.Nodes, s.ClientProcs, s.FDLimit-s.FDReserve); err != nil && tc.fdLimit >= 20_000 {
			t.Errorf("scaleSettings(%d, %d) does not fit: %v", tc.waiters, tc.fdLimit, err)
		}
	}
}

func TestParseLastCounters(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    clientCounters
		wantOK  bool
		reasons int
	}{
		{name: "empty", in: "", wantOK: false},
		{name: "no json", in: "starting\nnoise\n", wantOK: false},
		{name: "last complete line",
			in:   `{"sent":1,"granted":0}` + "\n" + `{"sent":5,"granted":1,"failed":2}` + "\n",
			want: clientCounters{Sent: 5, Granted: 1, Failed: 2}, wantOK: true},
		{name: "cut short last line skipped",
			in:   `{"sent":5,"rejected":3}` + "\n" + `{"sent":9,"gra`,
			want: clientCounters{Sent: 5, Rejected: 3}, wantOK: true},
		{name: "final with reasons after stderr",
			in:   `{"sent":2}` + "\nbench client: oops\n" + `{"sent":3,"final":true,"reasons":{"max_wait":2}}` + "\n",
			want: clientCounters{Sent: 3, Final: true}, wantOK: true, reasons: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseLastCounters([]byte(tc.in))
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tc.wantOK)
			}
			if got.Reasons["max_wait"] != tc.reasons {
				t.Errorf("reasons = %v, want max_wait %d", got.Reasons, tc.reasons)
			}
			got.Reasons = nil
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseInfoInt(t *testing.T) {
	info := "# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\nused_memory_rss:4096\r\nbad:x\r\n"
	for _, tc := range []struct {
		field  string
		want   int64
		wantOK bool
	}{
		{"used_memory", 1 << 20, true},
		{"used_memory_rss", 4096, true},
		{"used_memory_human", 0, false},
		{"bad", 0, false},
		{"missing", 0, false},
	} {
		got, ok := parseInfoInt(info, tc.field)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("parseInfoInt(%q) = %d, %v, want %d, %v", tc.field, got, ok, tc.want, tc.wantOK)
		}
	}
}

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
			Settings: scaleSettings(50_000, 20_000),
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
	scaleMarkdown(&b, &Scale{Settings: scaleSettings(50_000, 20_000), Queued: 50_000,
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

func TestGenericError(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"dial tcp 127.0.0.1:4711: i/o timeout", "dial tcp N.N.N.N:N: i/o timeout"},
		{"stream ended without [DONE]", "stream ended without [DONE]"},
		{"read tcp 127.0.0.1:50000->127.0.0.1:80: reset", "read tcp N.N.N.N:N->N.N.N.N:N: reset"},
	} {
		if got := genericError(tc.in); got != tc.want {
			t.Errorf("genericError(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseCPULine(t *testing.T) {
	for _, tc := range []struct {
		in          string
		busy, total int64
		ok          bool
	}{
		{"cpu  100 5 50 800 20 3 2 0 7 0\ncpu0 1 2 3 4\n", 160, 980, true},
		{"cpu  10 0 10 80\n", 20, 100, true},
		{"cpu0 10 0 10 80\n", 0, 0, false},
		{"cpu  10 x 10 80\n", 0, 0, false},
		{"", 0, 0, false},
	} {
		busy, total, ok := parseCPULine(tc.in)
		if busy != tc.busy || total != tc.total || ok != tc.ok {
			t.Errorf("parseCPULine(%q) = %d, %d, %v, want %d, %d, %v", tc.in, busy, total, ok, tc.busy, tc.total, tc.ok)
		}
	}
}

func TestHandoffsCPULine(t *testing.T) {
	h := &Handoffs{MachineBusy: 0.475, CaddyCores: 0.5, RedisCores: 0.1}
	if got, want := h.cpuLine(), "machine 48% busy, Caddy 0.50 cores, Redis 0.10"; got != want {
		t.Errorf("cpuLine = %q, want %q", got, want)
	}
	h.ClientCores, h.RedisRTTP50, h.RedisRTTP99 = 0.2, 0.1, 0.9
	if got, want := h.cpuLine(), "machine 48% busy, Caddy 0.50 cores, Redis 0.10, clients 0.20; Redis round trip p50 0.100 ms, p99 0.900 ms"; got != want {
		t.Errorf("cpuLine = %q, want %q", got, want)
	}
}
