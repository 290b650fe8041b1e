package requeue

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// A controller stopped with work queued runs none of it: the reconcile
// under way ends, and nothing starts with the stop's cancelled context.
func TestNoReconcileStartsAfterTheStop(t *testing.T) {
	started := make(chan struct{})
	var (
		calls        atomic.Int32
		afterTheStop atomic.Int32
		once         sync.Once
	)
	r := reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
		calls.Add(1)
		if ctx.Err() != nil {
			afterTheStop.Add(1)
			return reconcile.Result{}, ctx.Err()
		}
		once.Do(func() { close(started) })
		<-ctx.Done() // busy until the stop
		return reconcile.Result{}, nil
	})
	c := newTestController(t, "requeue-stop", r, func(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for i := range 20 {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "test", Name: fmt.Sprintf("item-%d", i)}})
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("controller ended before its first reconcile: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("controller: %v", err)
	}
	if n := afterTheStop.Load(); n != 0 {
		t.Errorf("%d reconciles started after the stop, with its cancelled context; want none", n)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d reconciles in all, want the one under way at the stop", n)
	}
}
