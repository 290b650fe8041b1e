package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// nodePickupGrace is how long the scheduler leaves a Machine it placed to
// its node agent, which records the placement in the first status it
// writes (rules.MarkScheduled). Only a Machine still unmarked after it,
// with its agent down or slow, gets the scheduler's own status write.
const nodePickupGrace = 2 * time.Second

// nodePickups remembers when this scheduler placed each Machine, until the
// Machine's status says it is placed.
type nodePickups struct {
	mu     sync.Mutex
	placed map[types.UID]time.Time
	now    func() time.Time
}

func newNodePickups() *nodePickups {
	return &nodePickups{placed: map[types.UID]time.Time{}, now: time.Now}
}

// placedNow records that m was placed a moment ago. A nil nodePickups
// (a scheduler built without SetupWithManager) records nothing, so every
// unmarked Machine is due at once.
func (p *nodePickups) placedNow(m *kaironv1.Machine) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.placed[m.UID] = p.now()
}

// due says whether the scheduler should mark the placed but unmarked
// Machine m itself now; if not, wait is how long its agent has left. A
// Machine this process did not place (by hand, or before a restart) is
// due at once.
func (p *nodePickups) due(m *kaironv1.Machine) (due bool, wait time.Duration) {
	if p == nil {
		return true, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.placed[m.UID]
	if !ok {
		return true, 0
	}
	if left := nodePickupGrace - p.now().Sub(at); left > 0 {
		return false, left
	}
	delete(p.placed, m.UID)
	return true, 0
}

// keepOnly forgets every Machine not in waiting: marked, or gone.
func (p *nodePickups) keepOnly(waiting map[types.UID]bool) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for uid := range p.placed {
		if !waiting[uid] {
			delete(p.placed, uid)
		}
	}
}
