package scenario

import (
	"os"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCPUPerRequest(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, tc := range []struct {
		name       string
		start, end cpuSample
		requests   int
		redis      bool
		want       report.LoadRun
		err        bool
	}{
		{name: "proxy only", start: cpuSample{proxy: 100 * ms}, end: cpuSample{proxy: 350 * ms}, requests: 1000,
			want: report.LoadRun{CPURequests: 1000, ProxyCPUMS: 250, ProxyCPUPerRequest: 0.25}},
		{name: "redis left out of a system without it", start: cpuSample{proxy: 0, redis: 10 * ms},
			end: cpuSample{proxy: 30 * ms, redis: 500 * ms}, requests: 300,
			want: report.LoadRun{CPURequests: 300, ProxyCPUMS: 30, ProxyCPUPerRequest: 0.1}},
		{name: "with redis", start: cpuSample{proxy: 1000 * ms, redis: 200 * ms},
			end: cpuSample{proxy: 1900 * ms, redis: 500 * ms}, requests: 3000, redis: true,
			want: report.LoadRun{CPURequests: 3000, ProxyCPUMS: 900, ProxyCPUPerRequest: 0.3, RedisCPUMS: 300, RedisCPUPerRequest: 0.1}},
		{name: "rounded to 0.1 us", start: cpuSample{}, end: cpuSample{proxy: 10 * ms}, requests: 3,
			want: report.LoadRun{CPURequests: 3, ProxyCPUMS: 10, ProxyCPUPerRequest: 3.3333}},
		{name: "no request", start: cpuSample{}, end: cpuSample{proxy: 10 * ms}, requests: 0,
			want: report.LoadRun{ProxyCPUMS: 10}},
		{name: "went backwards", start: cpuSample{proxy: 10 * ms}, end: cpuSample{proxy: 5 * ms}, requests: 10, err: true},
		{name: "unreadable", start: cpuSample{err: os.ErrNotExist}, end: cpuSample{proxy: 5 * ms}, requests: 10, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var run report.LoadRun
			err := recordCPU(&run, tc.start, tc.end, tc.requests, tc.redis)
			if tc.err {
				assert.Error(t, err)
				assert.Zero(t, run.ProxyCPUPerRequest)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, run)
			assert.InDelta(t, tc.want.ProxyCPUPerRequest+tc.want.RedisCPUPerRequest, run.TotalCPUPerRequest(), 1e-9)
		})
	}
}
