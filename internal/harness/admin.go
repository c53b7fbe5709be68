package harness

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// QueueStats is the part of a queue's entry in the admin API (GET
// /fair_queue/) that the tests read.
type QueueStats struct {
	Name  string `json:"name"`
	Stats struct {
		Waiting  int `json:"waiting"`
		InFlight int `json:"in_flight"`
	} `json:"stats"`
}

// Queue returns this instance's view of queue name, from the admin API.
func (c *Caddy) Queue(name string) (QueueStats, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get(c.AdminURL() + "/fair_queue/")
	if err != nil {
		return QueueStats{}, err
	}
	defer resp.Body.Close()
	var list struct {
		Queues []QueueStats `json:"queues"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return QueueStats{}, fmt.Errorf("decode /fair_queue/: %w", err)
	}
	for _, q := range list.Queues {
		if q.Name == name {
			return q, nil
		}
	}
	return QueueStats{}, fmt.Errorf("queue %q not in /fair_queue/", name)
}

// WaitQueue polls the admin API until queue name has waiting waiters and
// inFlight permits held, and fails the test if it does not within d.
func (c *Caddy) WaitQueue(name string, waiting, inFlight int, d time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	var last QueueStats
	var err error
	for time.Now().Before(deadline) {
		last, err = c.Queue(name)
		if err == nil && last.Stats.Waiting == waiting && last.Stats.InFlight == inFlight {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("queue %s: want %d waiting and %d in flight within %v; last seen %+v (%v)",
		name, waiting, inFlight, d, last.Stats, err)
}
