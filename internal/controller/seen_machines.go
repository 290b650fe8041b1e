package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// seenMachines remembers the UIDs of Machines the watch delivered, stored or
// deleted, for as long as an admission charge can stand. The Machine webhook
// settles a create's charge with it even when the Machine was deleted again
// before the next admission listed the namespace; without it, that room
// would stay taken until the charge expired.
type seenMachines struct {
	mu   sync.Mutex
	uids map[types.UID]time.Time
	now  func() time.Time
}

func newSeenMachines() *seenMachines {
	return &seenMachines{uids: map[types.UID]time.Time{}, now: time.Now}
}

// observe records obj's UID; it is a watch event handler's body.
func (s *seenMachines) observe(obj any) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	m, ok := obj.(*kaironv1.Machine)
	if !ok || m.UID == "" {
		return
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, known := s.uids[m.UID]; !known {
		s.uids[m.UID] = now // when first delivered: seenBefore compares it
	}
	// Forget what no charge can need any more. The sweep runs when the map
	// has grown, so its cost is spread over the inserts.
	if len(s.uids) > 1024 && len(s.uids)%1024 == 0 {
		for uid, at := range s.uids {
			if now.Sub(at) > 2*rules.AdmissionChargeTTL {
				delete(s.uids, uid)
			}
		}
	}
}

// seenBefore says whether the watch delivered uid before t. An admission
// asks with the time it began listing the namespace's Machines: a Machine
// delivered after that may be missing from its list, and dropping its
// charge as settled would count it nowhere (a quota of 3 once admitted 4).
func (s *seenMachines) seenBefore(uid types.UID, t time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.uids[uid]
	return ok && at.Before(t)
}

// handler is the event handler that feeds s.
func (s *seenMachines) handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.observe(obj) },
		UpdateFunc: func(_, obj any) { s.observe(obj) },
		DeleteFunc: s.observe,
	}
}
