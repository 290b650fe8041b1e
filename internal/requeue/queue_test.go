package requeue

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/zyvor/kairon/internal/testenv"
)

// An object known only from the initial list (as every object is after a
// restart) is reconciled, and its requeue runs, while changes keep the
// queue busy. On controller-runtime's priority queue it would wait behind
// the changes for as long as they come.
func TestInitialListObjectIsNotStarvedByChanges(t *testing.T) {
	quiet := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "test", Name: "quiet"}}
	quietKey := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(quiet)}
	var quietRuns, changeRuns atomic.Int32
	r := reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
		if req == quietKey {
			quietRuns.Add(1)
			return reconcile.Result{RequeueAfter: time.Millisecond}, nil
		}
		// A stream of changes: always another one ready. Each takes a
		// moment of real time, as a reconcile's API calls do: the pause is
		// the work, not a wait for a state.
		changeRuns.Add(1)
		time.Sleep(time.Millisecond)
		return reconcile.Result{RequeueAfter: time.Nanosecond}, nil
	})
	var (
		once   sync.Once
		queued = make(chan workqueue.TypedRateLimitingInterface[reconcile.Request])
	)
	c := newTestController(t, "requeue-order", r, func(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		once.Do(func() { queued <- q })
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	var q workqueue.TypedRateLimitingInterface[reconcile.Request]
	select {
	case q = <-queued:
	case err := <-done:
		t.Fatalf("controller ended before its source started: %v", err)
	}
	for i := range 3 {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "test", Name: fmt.Sprintf("change-%d", i)}})
	}
	testenv.Eventually(t, 30*time.Second, "the changes to run", func() (bool, string) {
		return changeRuns.Load() >= 3, fmt.Sprintf("%d runs", changeRuns.Load())
	})
	// Queued as the initial list queues it.
	(&handler.EnqueueRequestForObject{}).Create(ctx, event.CreateEvent{Object: quiet, IsInInitialList: true}, q)

	testenv.Eventually(t, 30*time.Second, "the initial-list object reconciled, and requeued, among the changes", func() (bool, string) {
		return quietRuns.Load() >= 2, fmt.Sprintf("reconciled %d times, the changes %d times", quietRuns.Load(), changeRuns.Load())
	})
}

// newTestController builds a controller with one worker, configured as
// Kairon's are, that reconciles with r (UntilStopped) and whose one source
// hands its queue to fill when the controller starts.
func newTestController(t *testing.T, name string, r reconcile.Reconciler, fill func(workqueue.TypedRateLimitingInterface[reconcile.Request])) controller.Controller {
	t.Helper()
	c, err := controller.NewTypedUnmanaged(name, controller.Options{
		Reconciler: UntilStopped(r), MaxConcurrentReconciles: 1,
		UsePriorityQueue: ControllerConfig().UsePriorityQueue, SkipNameValidation: ptr.To(true),
	})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Watch(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		fill(q)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
