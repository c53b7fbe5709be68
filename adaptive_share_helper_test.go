package caddyfairqueue

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// reportedShare is the learned share of queue name in its store, as the
// admin API shows it; nil while nothing was reported.
func reportedShare(t *testing.T, name string) *float64 {
	t.Helper()
	rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
	require.NoError(t, err)
	var rep struct {
		Queues []struct {
			Name     string `json:"name"`
			Snapshot *struct {
				LearnedShare *float64 `json:"learned_share"`
			} `json:"snapshot"`
		} `json:"queues"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
	for _, q := range rep.Queues {
		if q.Name == name && q.Snapshot != nil {
			return q.Snapshot.LearnedShare
		}
	}
	return nil
}

// learnedShare is the share in force of queue name, as the admin API
// shows it; 1 before the queue learned any.
func learnedShare(t *testing.T, name string) float64 {
	t.Helper()
	if s := reportedShare(t, name); s != nil {
		return *s
	}
	return 1
}
