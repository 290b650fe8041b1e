package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// The case of issue 17, item 4: a node reports 4Gi allocatable, and a pod
// kube-scheduler put there asks for 3Gi. A 2Gi Machine that may only run
// there waits, saying the pods take the room; one that may run anywhere
// goes to the other node; once the pod is gone the first one is placed.
func TestSchedulerCountsPodsBoundToNodes(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	forceDeletePodsAtEnd(t, env, ns)
	zoneA := func(n *corev1.Node) { n.Labels["zone"] = "a" }
	a := createNode(t, env, ns, "a", 4, "4Gi", zoneA)
	b := createNode(t, env, ns, "b", 4, "4Gi")
	db := createBoundPod(t, env, ns, "db", a.Name, "500m", "3Gi")
	startControllers(t, env, ns, Options{})

	createMachine(t, env, ns, "pinned", 1, "2Gi", func(m *kaironv1.Machine) { m.Spec.NodeSelector = map[string]string{"zone": "a"} })
	createMachine(t, env, ns, "anywhere", 1, "2Gi")
	waitPending(t, env, ns, "pinned", kaironv1.MachineReasonUnschedulable,
		"0/2 nodes are available: 1 node does not match spec.nodeSelector, 1 node has insufficient memory (free 1Gi, need 2Gi; pods on it request 3Gi)")
	if m := waitScheduled(t, env, ns, "anywhere"); m.Spec.NodeName != b.Name {
		t.Errorf("machine anywhere placed on %s, want %s: node a's pod leaves it 1Gi", m.Spec.NodeName, b.Name)
	}

	if err := env.Client.Delete(context.Background(), db, client.GracePeriodSeconds(0)); err != nil {
		t.Fatalf("deleting pod db: %v", err)
	}
	if m := waitScheduled(t, env, ns, "pinned"); m.Spec.NodeName != a.Name {
		t.Errorf("machine pinned placed on %s, want %s", m.Spec.NodeName, a.Name)
	}
}

// createBoundPod creates a pod already bound to node, as kube-scheduler
// leaves one; with no kubelet here it stays Pending, which counts.
func createBoundPod(t *testing.T, env *testenv.Env, ns, name, node, cpu, memory string) *corev1.Pod {
	t.Helper()
	list := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: "app", Image: "example.invalid/app", Resources: corev1.ResourceRequirements{Requests: list}}},
		},
	}
	// The namespace's default ServiceAccount, which admission looks
	// for, appears moments after the namespace.
	eventually(t, "pod "+name+" to be created", func() (bool, string) {
		err := env.Client.Create(context.Background(), pod.DeepCopy())
		return err == nil || apierrors.IsAlreadyExists(err), errString(err)
	})
	return pod
}

// forceDeletePodsAtEnd removes the test's pods without waiting for a
// kubelet there is none of. Registered before the controllers start, it
// runs after they stop, so nothing recreates them.
func forceDeletePodsAtEnd(t *testing.T, env *testenv.Env, ns string) {
	t.Cleanup(func() {
		err := env.Client.DeleteAllOf(context.Background(), &corev1.Pod{}, client.InNamespace(ns), client.GracePeriodSeconds(0))
		if err != nil {
			t.Errorf("deleting the test's pods: %v", err)
		}
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
