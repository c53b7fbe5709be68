package capacity

// The capacity scenario's workload: the drawn sequence of requests and
// the backend's ideal on it.

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
)

// capRequest is one request of a drawn sequence.
type capRequest struct {
	At     time.Duration
	Prompt int // tokens: the body carries 4 bytes of text per token
	Answer int // tokens: the body's max_tokens
	Long   bool
}

// capSample is the number of requests drawn to estimate a mix's
// capacity (the sequence's own sizes are the first of the same draw).
const capSample = 4000

// drawRequest returns the sizes of one request of w.
func drawRequest(w report.CapacityWorkload, r *rand.Rand) capRequest {
	var q capRequest
	if r.Float64() < w.LongShare {
		q.Long = true
		q.Prompt = w.LongPromptMin + r.IntN(w.LongPromptMax-w.LongPromptMin+1)
	} else {
		q.Prompt = w.ChatPromptMin + r.IntN(w.ChatPromptMax-w.ChatPromptMin+1)
	}
	a := math.Round(float64(w.AnswerMedian) * math.Exp(w.AnswerSigma*r.NormFloat64()))
	q.Answer = max(1, min(int(a), w.AnswerMax))
	return q
}

// workloadSizes draws n requests' sizes from seed.
func workloadSizes(w report.CapacityWorkload, seed uint64, n int) []capRequest {
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([]capRequest, n)
	for i := range out {
		out[i] = drawRequest(w, r)
	}
	return out
}

// workloadSeed is the seed of workload i: the same sizes on every
// topology.
func workloadSeed(s report.CapacitySettings, i int) uint64 { return s.Seed + uint64(i)*1000 }

// capacityPlan draws the sequence of workload wi on t: Poisson arrivals
// for ArrivalsS at Load x the ideal capacity (in requests per second, the
// sample's mean answer), the sizes in the order of the seed's draw. It
// returns the sequence, the rate and the ideal of t on it.
func capacityPlan(set report.CapacitySettings, t report.CapacityTopology, wi int) ([]capRequest, float64, report.Ideal) {
	w := set.Workloads[wi]
	seed := workloadSeed(set, wi)
	sample := workloadSizes(w, seed, capSample)
	ideal := idealCapacity(t, sample)
	meanAnswer := 0.0
	for _, q := range sample {
		meanAnswer += float64(q.Answer)
	}
	meanAnswer /= float64(len(sample))
	rate := w.Load * ideal.CapacityTPS / meanAnswer
	gaps := rand.New(rand.NewPCG(seed, 2))
	var seq []capRequest
	at := 0.0
	sizes := sample
	for {
		at += gaps.ExpFloat64() / rate
		if at > set.ArrivalsS {
			break
		}
		if len(sizes) == 0 {
			sizes = workloadSizes(w, seed+uint64(len(seq)), capSample)
		}
		q := sizes[0]
		sizes = sizes[1:]
		q.At = report.Secs(at)
		seq = append(seq, q)
	}
	offered := 0
	for _, q := range seq {
		offered += q.Answer
	}
	ideal.GoodputTPS = report.Round(min(ideal.CapacityTPS, float64(offered)/set.ArrivalsS), 1)
	return seq, report.Round(rate, 3), ideal
}

// idealCapacity is the bound of t on a mix of requests: each replica runs
// as many sequences as its cache holds of the mix's average sequence (a
// sequence holds its prompt and, on average over its answer, half of
// it; at most max_num_seqs), never preempts and never idles, so a
// completion token costs step_base / batch + step_per_seq and a prompt
// token prefill_per_token. The replicas' rates add up (the load spread
// in proportion to them). The ideal time to first token is a prompt's own
// prefill, in chunks, in steps of a full batch, waiting for nothing.
func idealCapacity(t report.CapacityTopology, mix []capRequest) report.Ideal {
	var prompt, answer, held float64
	for _, q := range mix {
		prompt += float64(q.Prompt)
		answer += float64(q.Answer)
		held += float64(q.Answer) * (float64(q.Prompt) + float64(q.Answer)/2)
	}
	var id report.Ideal
	if answer == 0 {
		return id
	}
	perSeq := held / answer // KV tokens of the average sequence in a step
	for _, r := range t.Replicas {
		batch := min(float64(r.MaxNumSeqs), float64(r.KVTokens)/perSeq)
		id.Batch = append(id.Batch, report.Round(batch, 1))
		tokenS := (r.StepBaseMS/batch + r.StepPerSeqMS) / 1000
		work := prompt*r.PrefillPerTokUS/1e6 + answer*tokenS
		id.CapacityTPS += answer / work
	}
	id.CapacityTPS = report.Round(id.CapacityTPS, 1)
	r, batch := t.Replicas[0], id.Batch[0]
	ttft := make([]float64, len(mix))
	for i, q := range mix {
		chunks := math.Ceil(float64(q.Prompt) / float64(r.MaxBatchedTokens))
		ttft[i] = chunks*(r.StepBaseMS+batch*r.StepPerSeqMS) + float64(q.Prompt-1)*r.PrefillPerTokUS/1000
	}
	slices.Sort(ttft)
	id.TTFTP50MS = report.Round(ttft[len(ttft)*50/100], 1)
	id.TTFTP99MS = report.Round(ttft[len(ttft)*99/100], 1)
	return id
}

func itoa(n int) string { return strconv.Itoa(n) }
