package requeue

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Once shut down, the queue hands out nothing more, however much it holds.
func TestQueueHandsOutNothingAfterShutdown(t *testing.T) {
	q := NewQueue("shutdown", workqueue.DefaultTypedControllerRateLimiter[string]())
	for _, item := range []string{"a", "b", "c"} {
		q.Add(item)
	}
	if item, shutdown := q.Get(); shutdown || item != "a" {
		t.Fatalf("Get before shutdown = %q, %v; want a, false", item, shutdown)
	}
	q.ShutDown()
	if item, shutdown := q.Get(); !shutdown {
		t.Errorf("Get after shutdown handed out %q with %d items still queued, want nothing", item, q.Len())
	}
	// The item being worked on when the queue stopped can still be done.
	q.Done("a")
}

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
	c, err := controller.NewTypedUnmanaged("requeue-stop", Options(controller.Options{
		Reconciler: r, MaxConcurrentReconciles: 1, UsePriorityQueue: ControllerConfig().UsePriorityQueue, SkipNameValidation: ptr.To(true),
	}))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Watch(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		for i := range 20 {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "test", Name: fmt.Sprintf("item-%d", i)}})
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
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
