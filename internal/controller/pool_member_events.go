package controller

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// A burst of claims changes one member of the pool per bind, and every
// change used to wake the pool's reconcile, which reads all of the pool's
// members each time: in a burst of a thousand claims the pool reconciler
// took a third of kairon-controller's CPU, on the machine the API server
// needs for the binds (docs/benchmarks.md). While its refill is held for
// binds the pool has nothing to do that cannot wait for its next recheck,
// so its members' events wait as long: many of them, one reconcile.
// Outside a hold they wake it at once, as before.

// heldPools are the pools whose last reconcile held their refill.
type heldPools struct {
	mu   sync.Mutex
	held map[types.NamespacedName]bool
	// deferBy is how long a held pool's member events wait:
	// refillHoldRecheck, when a held pool is reconciled anyway.
	deferBy time.Duration
}

func newHeldPools() *heldPools {
	return &heldPools{held: map[types.NamespacedName]bool{}, deferBy: refillHoldRecheck}
}

// set records whether pool's refill is held now.
func (h *heldPools) set(pool types.NamespacedName, held bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if held {
		h.held[pool] = true
	} else {
		delete(h.held, pool)
	}
}

func (h *heldPools) isHeld(pool types.NamespacedName) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held[pool]
}

// memberEvents maps a member's events to its pool (poolOfMachine), passing
// updates through changed. A held pool's request is added after deferBy;
// the workqueue keeps one request per pool, at the earliest time asked for.
func (h *heldPools) memberEvents(changed func(event.UpdateEvent) bool) handler.Funcs {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	enqueue := func(o client.Object, q queue) {
		for _, req := range poolOfMachine(context.Background(), o) {
			if h.isHeld(req.NamespacedName) {
				q.AddAfter(req, h.deferBy)
				continue
			}
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q queue) { enqueue(e.Object, q) },
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q queue) {
			if changed(e) {
				// A member that left the pool (its label changed) counts
				// for the pool it left too.
				enqueue(e.ObjectNew, q)
				enqueue(e.ObjectOld, q)
			}
		},
		DeleteFunc:  func(_ context.Context, e event.DeleteEvent, q queue) { enqueue(e.Object, q) },
		GenericFunc: func(_ context.Context, e event.GenericEvent, q queue) { enqueue(e.Object, q) },
	}
}
