package scale

import (
	"reflect"
	"strings"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario"
)

func TestPlanClients(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		total, nodes, procs, perPro int
		want                        []report.ClientShare
		err                         string
	}{
		{name: "even", total: 50_000, nodes: 3, procs: 3, perPro: 18_000,
			want: []report.ClientShare{{Node: 0, Waiters: 16_667}, {Node: 1, Waiters: 16_667}, {Node: 2, Waiters: 16_666}}},
		{name: "two per node", total: 10, nodes: 2, procs: 4, perPro: 100,
			want: []report.ClientShare{{Node: 0, Waiters: 3}, {Node: 1, Waiters: 3}, {Node: 0, Waiters: 2}, {Node: 1, Waiters: 2}}},
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

func TestGenericError(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"dial tcp 127.0.0.1:4711: i/o timeout", "dial tcp N.N.N.N:N: i/o timeout"},
		{"stream ended without [DONE]", "stream ended without [DONE]"},
		{"read tcp 127.0.0.1:50000->127.0.0.1:80: reset", "read tcp N.N.N.N:N->N.N.N.N:N: reset"},
	} {
		if got := scenario.GenericError(tc.in); got != tc.want {
			t.Errorf("scenario.GenericError(%q) = %q, want %q", tc.in, got, tc.want)
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

func TestScaleSettingsFitTheFileLimit(t *testing.T) {
	for _, tc := range []struct {
		waiters, fdLimit, wantProcs int
	}{
		{0, 20_000, 3},
		{50_000, 20_000, 3},
		{50_000, 10_000, 9}, // 8,000 each: 7, rounded up to a multiple of 3
		{2_000, 20_000, 3},
	} {
		s := report.DefaultScaleSettings(tc.waiters, tc.fdLimit)
		if s.ClientProcs != tc.wantProcs {
			t.Errorf("DefaultScaleSettings(%d, %d).ClientProcs = %d, want %d", tc.waiters, tc.fdLimit, s.ClientProcs, tc.wantProcs)
		}
		if _, err := planClients(s.Waiters, s.Nodes, s.ClientProcs, s.FDLimit-s.FDReserve); err != nil && tc.fdLimit >= 20_000 {
			t.Errorf("DefaultScaleSettings(%d, %d) does not fit: %v", tc.waiters, tc.fdLimit, err)
		}
	}
}
