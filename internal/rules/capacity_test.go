package rules

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

const (
	testMi = int64(1) << 20
	testGi = int64(1) << 30
)

func requests(cpu, memory string) corev1.ResourceRequirements {
	list := corev1.ResourceList{}
	if cpu != "" {
		list[corev1.ResourceCPU] = resource.MustParse(cpu)
	}
	if memory != "" {
		list[corev1.ResourceMemory] = resource.MustParse(memory)
	}
	return corev1.ResourceRequirements{Requests: list}
}

// testPod is a Running pod on node with one container per requests.
func testPod(name, node string, containers ...corev1.ResourceRequirements) corev1.Pod {
	pod := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, r := range containers {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "c", Resources: r})
	}
	return pod
}

func bookingPod(name, node string, r corev1.ResourceRequirements) corev1.Pod {
	pod := testPod(name, node, r)
	pod.Labels = map[string]string{LabelCapacityBooking: "true"}
	pod.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: kaironv1.GroupVersion.String(), Kind: "Machine", Name: "m", UID: "uid-m", Controller: ptr.To(true),
	}}
	return pod
}

func TestEffectivePodRequests(t *testing.T) {
	always := ptr.To(corev1.ContainerRestartPolicyAlways)
	tests := []struct {
		name string
		pod  func() corev1.Pod
		want PodRequests
	}{
		{"containers add up", func() corev1.Pod {
			return testPod("p", "a", requests("100m", "128Mi"), requests("1", "1Gi"))
		}, PodRequests{MilliCPU: 1100, Memory: testGi + 128*testMi}},
		{"a container with only limits is requested at them", func() corev1.Pod {
			p := testPod("p", "a")
			p.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("2Gi"),
			}}}}
			return p
		}, PodRequests{MilliCPU: 2000, Memory: 2 * testGi}},
		{"a larger init container sets the peak", func() corev1.Pod {
			p := testPod("p", "a", requests("100m", "128Mi"))
			p.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: requests("500m", "1Gi")}}
			return p
		}, PodRequests{MilliCPU: 500, Memory: testGi}},
		{"a sidecar runs beside the containers and later init steps", func() corev1.Pod {
			p := testPod("p", "a", requests("100m", "128Mi"))
			p.Spec.InitContainers = []corev1.Container{
				{Name: "sidecar", RestartPolicy: always, Resources: requests("200m", "256Mi")},
				{Name: "init", Resources: requests("100m", "512Mi")},
			}
			return p
		}, PodRequests{MilliCPU: 300, Memory: 768 * testMi}},
		{"pod-level requests win, and the overhead is added", func() corev1.Pod {
			p := testPod("p", "a", requests("100m", "128Mi"))
			r := requests("1", "2Gi")
			p.Spec.Resources = &r
			p.Spec.Overhead = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
			return p
		}, PodRequests{MilliCPU: 1000, Memory: 2*testGi + 64*testMi}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := tc.pod()
			if got := EffectivePodRequests(&pod); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestChargePods(t *testing.T) {
	mod := func(p corev1.Pod, f func(*corev1.Pod)) corev1.Pod { f(&p); return p }
	tests := []struct {
		name  string
		pods  []corev1.Pod
		wantA PodRequests
	}{
		{"a running pod is charged", []corev1.Pod{testPod("p", "a", requests("500m", "1Gi"))}, PodRequests{MilliCPU: 500, Memory: testGi}},
		{"a pending bound pod is charged", []corev1.Pod{mod(testPod("p", "a", requests("", "1Gi")), func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending })}, PodRequests{Memory: testGi}},
		{"finished pods are not", []corev1.Pod{
			mod(testPod("done", "a", requests("", "1Gi")), func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
			mod(testPod("failed", "a", requests("", "1Gi")), func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
		}, PodRequests{}},
		{"pods of other nodes and unbound pods are not", []corev1.Pod{
			testPod("other", "b", requests("", "1Gi")), testPod("unbound", "", requests("", "1Gi")), testPod("unknown-node", "z", requests("", "1Gi")),
		}, PodRequests{}},
		{"a booking pod stands for a Machine already charged", []corev1.Pod{bookingPod("booking", "a", requests("1", "1Gi"))}, PodRequests{}},
		{"the label alone does not make a booking pod", []corev1.Pod{
			mod(bookingPod("impostor", "a", requests("", "1Gi")), func(p *corev1.Pod) { p.OwnerReferences = nil }),
		}, PodRequests{Memory: testGi}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			byName := map[string]*NodeInfo{}
			for _, n := range infos(nil, rulestest.Node("a", 4, "4Gi"), rulestest.Node("b", 4, "4Gi")) {
				byName[n.Node.Name] = n
			}
			ChargePods(byName, tc.pods)
			if got := byName["a"].Pods; got != tc.wantA {
				t.Errorf("node a: pods charged %+v, want %+v", got, tc.wantA)
			}
		})
	}
}

func TestForMachinesSubtractsPods(t *testing.T) {
	tests := []struct {
		name string
		pods PodRequests
		want Resources
	}{
		{"no pods: the allocatable", PodRequests{}, Resources{CPU: 4, Memory: 4 * testGi}},
		{"a 100m pod costs the vCPU it cuts into", PodRequests{MilliCPU: 100, Memory: 128 * testMi}, Resources{CPU: 3, Memory: 4*testGi - 128*testMi}},
		{"whole CPUs cost exactly that", PodRequests{MilliCPU: 2000, Memory: 3 * testGi}, Resources{CPU: 2, Memory: testGi}},
		{"pods beyond the node leave less than nothing", PodRequests{MilliCPU: 4500, Memory: 5 * testGi}, Resources{CPU: -1, Memory: -testGi}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := NewNodeInfo(rulestest.Node("a", 4, "4Gi"))
			n.Pods = tc.pods
			if got := n.ForMachines(); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The case of issue 17: 4Gi allocatable, a foreign pod asking 3Gi. A 2Gi
// Machine does not fit there, the message names the pods' share, and the
// Machine goes to a node without pods.
func TestPickNodeCountsPods(t *testing.T) {
	full := NewNodeInfo(rulestest.Node("a", 4, "4Gi"))
	ChargePods(map[string]*NodeInfo{"a": full}, []corev1.Pod{testPod("db", "a", requests("1500m", "3Gi"))})
	m := rulestest.Machine("m", 2, "2Gi")

	_, why := PickNode([]*NodeInfo{full}, m)
	want := "0/1 nodes are available: 1 node has insufficient memory (free 1Gi, need 2Gi; pods on it request 3Gi)"
	if why != want {
		t.Errorf("alone: got %q, want %q", why, want)
	}

	m3 := rulestest.Machine("m", 3, "256Mi")
	_, why = PickNode([]*NodeInfo{full}, m3)
	want = "0/1 nodes are available: 1 node has insufficient cpu (free 2, need 3; pods on it request 1500m)"
	if why != want {
		t.Errorf("cpu: got %q, want %q", why, want)
	}

	empty := NewNodeInfo(rulestest.Node("b", 4, "4Gi"))
	if got, why := PickNode([]*NodeInfo{full, empty}, m); got != empty {
		t.Errorf("with an empty node: got %s (%s), want node b", nodeName(got), why)
	}
}

func nodeName(n *NodeInfo) string {
	if n == nil {
		return "none"
	}
	return n.Node.Name
}
