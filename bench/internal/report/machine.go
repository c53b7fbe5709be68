package report

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Machine describes where a run happened.
type Machine struct {
	// CPUs is nproc; CPU the model name from /proc/cpuinfo.
	CPUs int    `json:"nproc"`
	CPU  string `json:"cpu_model"`
	// MemoryMB is the total memory; Kernel the kernel release.
	MemoryMB int64  `json:"memory_mb"`
	Kernel   string `json:"kernel"`
	// Go, Redis, HAProxy and Caddy are versions (first line printed).
	Go      string `json:"go"`
	Redis   string `json:"redis"`
	HAProxy string `json:"haproxy"`
	Caddy   string `json:"caddy"`
	// LoadStart and LoadEnd are the 1-minute load averages when the run
	// started and ended: other work on the machine skews the figures.
	LoadStart float64 `json:"loadavg_start"`
	LoadEnd   float64 `json:"loadavg_end"`
}

// LoadAverage returns the 1-minute load average, 0 if unknown.
func LoadAverage() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// DescribeMachine reads the machine and the versions of the servers used.
func DescribeMachine(caddy, haproxy string) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadStart: LoadAverage()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				if f := strings.Fields(rest); len(f) > 0 {
					kb, _ := strconv.ParseInt(f[0], 10, 64)
					m.MemoryMB = kb / 1024
				}
			}
		}
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(data))
	}
	m.Redis = firstLine("redis-server", "--version")
	if haproxy != "" {
		m.HAProxy = firstLine(haproxy, "-v")
	}
	m.Caddy = firstLine(caddy, "version")
	return m
}

// firstLine runs a command briefly and returns the first line it printed.
func firstLine(name string, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil && len(out) == 0 {
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}
