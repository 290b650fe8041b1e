package node

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// ownWrites lets the Machine reconciler read its own writes. The agent's
// cache learns of a write through its watch, a moment after the write
// returns; a reconcile that starts in that moment (the VM came up 200 ms
// after its Booting write, under load) would compute the next status from
// the version before the write, and its locked write would be refused with
// a Conflict, costing the API server a refused request and the Machine a
// retry. So the agent keeps the object each write returned until its cache
// has moved past the version the write replaced.
//
// Only this agent's writes are substituted, and only while the cache still
// shows exactly the version the write was based on: any other version means
// the cache has seen the write (or something later), and is used as it is.
type ownWrites struct {
	mu      sync.Mutex
	entries map[types.NamespacedName]ownWrite
}

type ownWrite struct {
	// replaced is the resourceVersion the write was made over.
	replaced string
	written  *kaironv1.Machine
}

// wrote records that this agent turned version replaced of a Machine into
// written, the object as the API server returned it.
func (w *ownWrites) wrote(replaced string, written *kaironv1.Machine) {
	if replaced == "" || written.ResourceVersion == "" || written.ResourceVersion == replaced {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.entries == nil {
		w.entries = map[types.NamespacedName]ownWrite{}
	}
	w.entries[types.NamespacedName{Namespace: written.Namespace, Name: written.Name}] = ownWrite{replaced: replaced, written: written.DeepCopy()}
}

// latest returns the newest version of cached this agent knows: its own
// last write while the cache is behind it, else cached itself.
func (w *ownWrites) latest(cached *kaironv1.Machine) *kaironv1.Machine {
	key := types.NamespacedName{Namespace: cached.Namespace, Name: cached.Name}
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.entries[key]
	if !ok {
		return cached
	}
	if e.written.UID != cached.UID || cached.ResourceVersion != e.replaced {
		delete(w.entries, key) // the cache caught up, or it is another Machine now
		return cached
	}
	return e.written.DeepCopy()
}

// forget drops what is known of a Machine that is gone.
func (w *ownWrites) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.entries, key)
}

// len is how many writes are remembered, for tests.
func (w *ownWrites) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.entries)
}
