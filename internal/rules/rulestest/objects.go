package rulestest

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Node is a ready Kairon node offering cpu vCPUs and memory.
func Node(name string, cpu int64, memory string, mutate ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kaironv1.LabelNode: "true"}},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{
				corev1.ResourceCPU:    *resource.NewQuantity(cpu, resource.DecimalSI),
				corev1.ResourceMemory: resource.MustParse(memory),
			},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, f := range mutate {
		f(n)
	}
	return n
}

// Machine is a Machine of namespace "team" asking for cpu vCPUs and memory.
func Machine(name string, cpu int32, memory string, mutate ...func(*kaironv1.Machine)) *kaironv1.Machine {
	m := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team", UID: types.UID("uid-" + name)},
		Spec:       kaironv1.MachineSpec{CPU: cpu, Memory: resource.MustParse(memory)},
	}
	for _, f := range mutate {
		f(m)
	}
	return m
}

// Placed puts a Machine on node in phase, as a mutation for Machine.
func Placed(node string, phase kaironv1.MachinePhase) func(*kaironv1.Machine) {
	return func(m *kaironv1.Machine) {
		m.Spec.NodeName = node
		m.Status.Phase = phase
	}
}

// Cordoned marks a Node unschedulable, as a mutation for Node.
func Cordoned(n *corev1.Node) { n.Spec.Unschedulable = true }

// NotReady turns a Node's Ready condition False, as a mutation for Node.
func NotReady(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }
