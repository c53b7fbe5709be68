package mockllm

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// ttftBuckets are vLLM's bounds of vllm:time_to_first_token_seconds.
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
	1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// histogram is a Prometheus histogram: counts[i] observations <= bounds[i]
// (not cumulative: write sums them), the last count those above every
// bound.
type histogram struct {
	bounds []float64
	counts []int64
	sum    float64
	count  int64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]int64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.counts[i]++
	h.sum += v
	h.count++
}

// gpuMetrics is what GET /metrics shows, read under the runner's lock.
type gpuMetrics struct {
	model                     string
	running, waiting, used    int
	kvTokens                  int
	totals                    gpuTotals
	ttftCounts                []int64
	ttftBounds                []float64
	ttftSum                   float64
	ttftCount                 int64
	maxNumSeqs, batchedTokens int
}

// metrics serves the GPU model's state in Prometheus' text format, under
// vLLM's names and meanings (the counters since start).
func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	m := s.gpu.metrics()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	writeMetrics(w, m)
}

func writeMetrics(w io.Writer, m gpuMetrics) {
	label := fmt.Sprintf("{model_name=%q}", m.model)
	metric := func(name, kind, help string, v float64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s%s %s\n", name, help, name, kind, name, label, num(v))
	}
	metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", float64(m.running))
	metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", float64(m.waiting))
	usage := 0.0
	if m.kvTokens > 0 {
		usage = float64(m.used) / float64(m.kvTokens)
	}
	metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage)
	metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", float64(m.totals.Preemptions))
	metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", float64(m.totals.PromptTokens))
	metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", float64(m.totals.GenerationTokens))
	metric("vllm:request_success_total", "counter", "Count of successfully processed requests.", float64(m.totals.Finished))
	// One token per block: num_gpu_blocks is the cache's size in tokens.
	fmt.Fprintf(w, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n")
	fmt.Fprintf(w, "vllm:cache_config_info{block_size=\"1\",num_gpu_blocks=\"%d\",max_num_seqs=\"%d\",max_num_batched_tokens=\"%d\"} 1\n",
		m.kvTokens, m.maxNumSeqs, m.batchedTokens)

	const ttft = "vllm:time_to_first_token_seconds"
	fmt.Fprintf(w, "# HELP %s Histogram of time to first token in seconds.\n# TYPE %s histogram\n", ttft, ttft)
	var cum int64
	for i, b := range m.ttftBounds {
		cum += m.ttftCounts[i]
		fmt.Fprintf(w, "%s_bucket{le=%q,model_name=%q} %d\n", ttft, num(b), m.model, cum)
	}
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\",model_name=%q} %d\n", ttft, m.model, m.ttftCount)
	fmt.Fprintf(w, "%s_count%s %d\n%s_sum%s %s\n", ttft, label, m.ttftCount, ttft, label, num(m.ttftSum))
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
