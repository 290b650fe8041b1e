package requeue

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/zyvor/kairon/internal/testenv"
)

// An object queued at low priority (as after a restart) whose reconcile
// asks to run again soon runs again even while changes keep the queue
// busy. Without AtNormalPriority its requeue would keep the low priority
// and wait behind the changes for as long as they come.
func TestRequeueOfALowPriorityObjectIsNotStarved(t *testing.T) {
	quiet := request("quiet")
	var (
		queueOnce sync.Once
		queued    = make(chan priorityqueue.PriorityQueue[reconcile.Request])
		queue     priorityqueue.PriorityQueue[reconcile.Request]
		quietRuns atomic.Int32
		busyRuns  atomic.Int32
	)
	r := reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
		if req != quiet {
			// A stream of changes: always another one ready.
			busyRuns.Add(1)
			time.Sleep(time.Millisecond)
			return reconcile.Result{RequeueAfter: time.Nanosecond}, nil
		}
		if quietRuns.Add(1) == 1 {
			// The changes start before the quiet object's requeue is due.
			for i := range 3 {
				queue.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(NormalPriority)}, request(fmt.Sprintf("busy-%d", i)))
			}
		}
		return reconcile.Result{RequeueAfter: time.Millisecond}, nil
	})
	c, err := controller.NewTypedUnmanaged("requeue-priority", controller.TypedOptions[reconcile.Request]{
		Reconciler: AtNormalPriority(r), MaxConcurrentReconciles: 1,
		UsePriorityQueue: ptr.To(true), SkipNameValidation: ptr.To(true),
	})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Watch(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request])
		if !ok {
			return fmt.Errorf("the controller's queue is a %T, not a priority queue", q)
		}
		queueOnce.Do(func() { queued <- pq })
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	select {
	case queue = <-queued:
	case err := <-done:
		t.Fatalf("controller ended before its source started: %v", err)
	}
	queue.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(handler.LowPriority)}, quiet)

	testenv.Eventually(t, 30*time.Second, "the quiet object's requeue to run among the changes", func() (bool, string) {
		return quietRuns.Load() >= 2, fmt.Sprintf("quiet object reconciled %d times, the changes %d times", quietRuns.Load(), busyRuns.Load())
	})
}

func request(name string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "test", Name: name}}
}
