package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// uidStamps remembers since when something has been so for each object:
// a pool's refill held, a pool's status change pending. Safe for
// concurrent use; now is replaceable for tests.
type uidStamps struct {
	mu    sync.Mutex
	since map[types.UID]time.Time
	now   func() time.Time
}

func newUIDStamps() uidStamps {
	return uidStamps{since: map[types.UID]time.Time{}, now: time.Now}
}

// elapsed is how long uid has been stamped, stamping it now if it was not
// (then 0).
func (s *uidStamps) elapsed(uid types.UID) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	since, ok := s.since[uid]
	if !ok {
		s.since[uid] = now
		return 0
	}
	return now.Sub(since)
}

// forget drops uid's stamp: the next elapsed starts afresh.
func (s *uidStamps) forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.since, uid)
}
