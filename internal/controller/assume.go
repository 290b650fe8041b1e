package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// assumeTTL bounds how long a binding is trusted without the informer cache
// confirming it. Watches deliver within milliseconds, so reaching it means
// the bind was undone behind our back, and forgetting is the safe way out.
const assumeTTL = 30 * time.Second

// assumedBindings remembers the nodes the scheduler bound Machines to until
// the informer cache shows the binding, as kube-scheduler's assume cache
// does. Without it, the pass after a bind could still see the Machine
// unplaced and its node emptier than it is, and put a second Machine into
// the same room.
type assumedBindings struct {
	mu    sync.Mutex
	nodes map[types.UID]assumedBinding
	now   func() time.Time
}

type assumedBinding struct {
	node string
	at   time.Time
}

func newAssumedBindings() *assumedBindings {
	return &assumedBindings{nodes: map[types.UID]assumedBinding{}, now: time.Now}
}

func (a *assumedBindings) assume(m *kaironv1.Machine, node string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nodes[m.UID] = assumedBinding{node: node, at: a.now()}
}

// apply overlays the assumed bindings onto Machines listed from the cache,
// returning copies for the Machines it changes, and forgets every binding
// the cache has caught up with (or whose Machine is gone).
func (a *assumedBindings) apply(machines []*kaironv1.Machine) []*kaironv1.Machine {
	a.mu.Lock()
	defer a.mu.Unlock()
	seen := make(map[types.UID]bool, len(a.nodes))
	now := a.now()
	for i, m := range machines {
		binding, ok := a.nodes[m.UID]
		if !ok {
			continue
		}
		seen[m.UID] = true
		if m.Spec.NodeName != "" || now.Sub(binding.at) > assumeTTL {
			delete(a.nodes, m.UID)
			continue
		}
		assumed := m.DeepCopy()
		assumed.Spec.NodeName = binding.node
		machines[i] = assumed
	}
	for uid := range a.nodes {
		if !seen[uid] {
			delete(a.nodes, uid)
		}
	}
	return machines
}

func (a *assumedBindings) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.nodes)
}
