package controller

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// policyWaiters wakes the binds waiting for a MachineNetworkPolicy's
// status as soon as the cache has a new version of it, instead of each
// bind polling the cache: the node's report is on the path of every bind
// with spec.egress.
type policyWaiters struct {
	mu      sync.Mutex
	waiting map[types.NamespacedName][]chan struct{}
}

// wait registers for the next change of policy key. Registered before the
// cache is read, so a change in between is not missed.
func (w *policyWaiters) wait(key types.NamespacedName) (changed <-chan struct{}, cancel func()) {
	ch := make(chan struct{})
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiting == nil {
		w.waiting = map[types.NamespacedName][]chan struct{}{}
	}
	w.waiting[key] = append(w.waiting[key], ch)
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		chans := w.waiting[key]
		for i, c := range chans {
			if c == ch {
				w.waiting[key] = append(chans[:i:i], chans[i+1:]...)
				break
			}
		}
		if len(w.waiting[key]) == 0 {
			delete(w.waiting, key)
		}
	}
}

func (w *policyWaiters) changed(o client.Object) {
	key := client.ObjectKeyFromObject(o)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.waiting[key] {
		close(ch)
	}
	delete(w.waiting, key)
}

// events is the watch handler that wakes the waiters; it asks for no
// reconcile.
func (w *policyWaiters) events() handler.TypedEventHandler[client.Object, reconcile.Request] {
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			w.changed(e.Object)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			w.changed(e.ObjectNew)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			w.changed(e.Object)
		},
	}
}
