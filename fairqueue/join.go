package fairqueue

import (
	"context"
	"errors"
	"time"
)

// rejoin tries to open the store again once per retryOpenAfter, from
// the first failed open until one succeeds or the node leaves: with no
// loop yet (the node never joined), nothing else would notice, with no
// request, that the store answers again, and the store would read down
// (health; store_up) until the next request. Joined, the loop probes.
func (s *session) rejoin() {
	defer close(s.retryDone)
	t := time.NewTicker(retryOpenAfter)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if err := s.join(context.Background()); err == nil || errors.Is(err, errClosed) {
			return
		}
	}
}
