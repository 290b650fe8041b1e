package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Events about any object, of any kind, fold into the one pass request.
func TestSinglePassFoldsEventsIntoOneRequest(t *testing.T) {
	key := reconcile.Request{NamespacedName: types.NamespacedName{Name: "test-pass"}}
	enqueue := passHandler(key)
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	ctx := context.Background()
	enqueue.Create(ctx, event.CreateEvent{Object: &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "m1"}}}, q)
	enqueue.Update(ctx, event.UpdateEvent{ObjectOld: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, ObjectNew: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}}, q)
	enqueue.Delete(ctx, event.DeleteEvent{Object: &kaironv1.MachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "mig"}}}, q)
	if q.Len() != 1 {
		t.Fatalf("queue holds %d requests, want 1", q.Len())
	}
	if got, _ := q.Get(); got != key {
		t.Errorf("queued %v, want %v", got, key)
	}
}
