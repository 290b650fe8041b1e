package controller

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

// A booking pod the kubelet rejected stays for bookingRetryDelay, so its
// reason can be read and the kubelet is not asked again at once, and is
// then replaced by a new one.
func TestCapacityBookingReplacesARejectedPodAfterTheDelay(t *testing.T) {
	ctx := context.Background()
	m := rulestest.Machine("vm", 1, "1Gi", rulestest.Placed("node-1", kaironv1.MachineRunning))
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	r := &CapacityBookingReconciler{Recorder: events.NewFakeRecorder(10)}
	rejected := r.bookingPod(m, "node-1")
	rejected.UID = "first"
	rejected.CreationTimestamp = metav1.NewTime(start)
	rejected.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "OutOfmemory"}
	api := fake.NewClientBuilder().WithScheme(testScheme(t)).
		WithIndex(&corev1.Pod{}, bookingMachineIndex, bookingMachineName).
		WithObjects(m, rejected).
		WithStatusSubresource(&kaironv1.Machine{}, &corev1.Pod{}).
		Build()
	r.Client = api
	now := start.Add(10 * time.Second)
	r.now = func() time.Time { return now }
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(m)}

	res, err := r.Reconcile(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if want := bookingRetryDelay - 10*time.Second; res.RequeueAfter != want {
		t.Errorf("within the delay: requeue after %s, want %s", res.RequeueAfter, want)
	}
	var pod corev1.Pod
	if err := api.Get(ctx, client.ObjectKeyFromObject(rejected), &pod); err != nil || pod.UID != "first" {
		t.Fatalf("within the delay the rejected pod must stay: %v, uid %q", err, pod.UID)
	}

	now = start.Add(bookingRetryDelay + time.Second)
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := api.Get(ctx, client.ObjectKeyFromObject(rejected), &pod); !apierrors.IsNotFound(err) {
		t.Fatalf("after the delay the rejected pod must go: %v (phase %s)", err, pod.Status.Phase)
	}
	// The next look (the pod's deletion event brings it) books again.
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := api.Get(ctx, client.ObjectKeyFromObject(rejected), &pod); err != nil || pod.Status.Phase == corev1.PodFailed || pod.Spec.NodeName != "node-1" {
		t.Fatalf("a new booking pod on node-1: %v, phase %s node %q", err, pod.Status.Phase, pod.Spec.NodeName)
	}
}
