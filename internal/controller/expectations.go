package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// replicaExpectations remembers the Machines a MachineSet controller created
// or deleted until the informer cache shows it, like ReplicaSet's
// expectations. Without it, a reconcile right after creating three Machines
// could still see none and create three more.
type replicaExpectations struct {
	mu   sync.Mutex
	sets map[types.UID]*expectedChanges
	now  func() time.Time
}

type expectedChanges struct {
	created map[string]time.Time    // by Machine name: not yet in the cache
	deleted map[types.UID]time.Time // still live in the cache
}

func newReplicaExpectations() *replicaExpectations {
	return &replicaExpectations{sets: map[types.UID]*expectedChanges{}, now: time.Now}
}

// changes returns the set's record, creating it. It also drops the records
// of sets that were never reconciled again (deleted sets) once everything in
// them has expired, so they do not pile up.
func (e *replicaExpectations) changes(set types.UID) *expectedChanges {
	now := e.now()
	for uid, c := range e.sets {
		if uid != set && c.expired(now) {
			delete(e.sets, uid)
		}
	}
	c := e.sets[set]
	if c == nil {
		c = &expectedChanges{created: map[string]time.Time{}, deleted: map[types.UID]time.Time{}}
		e.sets[set] = c
	}
	return c
}

func (e *replicaExpectations) created(set types.UID, machine string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.changes(set).created[machine] = e.now()
}

func (e *replicaExpectations) deleted(set types.UID, machine types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.changes(set).deleted[machine] = e.now()
}

func (e *replicaExpectations) forget(set types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.sets, set)
}

// reconcile takes the set's Machines as the cache shows them (all of them,
// terminating ones included) and returns the live ones without those
// already deleted, plus how many created ones the cache has yet to show.
// What the cache has caught up with, or what waited past assumeTTL, is
// forgotten.
func (e *replicaExpectations) reconcile(set types.UID, owned []*kaironv1.Machine) (live []*kaironv1.Machine, createsInFlight int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.sets[set]
	if c == nil {
		for _, m := range owned {
			if m.DeletionTimestamp == nil {
				live = append(live, m)
			}
		}
		return live, 0
	}
	now := e.now()
	seenNames := map[string]bool{}
	liveUIDs := map[types.UID]bool{}
	for _, m := range owned {
		seenNames[m.Name] = true
		if m.DeletionTimestamp != nil {
			continue
		}
		liveUIDs[m.UID] = true
		if at, ok := c.deleted[m.UID]; ok && now.Sub(at) <= assumeTTL {
			continue
		}
		live = append(live, m)
	}
	for name, at := range c.created {
		if seenNames[name] || now.Sub(at) > assumeTTL {
			delete(c.created, name)
		}
	}
	for uid, at := range c.deleted {
		if !liveUIDs[uid] || now.Sub(at) > assumeTTL {
			delete(c.deleted, uid)
		}
	}
	createsInFlight = len(c.created)
	if createsInFlight == 0 && len(c.deleted) == 0 {
		delete(e.sets, set)
	}
	return live, createsInFlight
}

func (c *expectedChanges) expired(now time.Time) bool {
	for _, at := range c.created {
		if now.Sub(at) <= assumeTTL {
			return false
		}
	}
	for _, at := range c.deleted {
		if now.Sub(at) <= assumeTTL {
			return false
		}
	}
	return true
}
