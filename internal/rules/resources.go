package rules

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// The API server defaults spec.cpu and spec.memory, but Machines built in
// memory (kaironctl, the webhook's decoded request before defaulting, unit
// tests) may lack them; charge them what the server would.
const (
	defaultMachineCPU    = 1
	defaultMachineMemory = "256Mi"
)

func MachineCPU(m *kaironv1.Machine) int32 {
	if m.Spec.CPU <= 0 {
		return defaultMachineCPU
	}
	return m.Spec.CPU
}

func MachineMemory(m *kaironv1.Machine) resource.Quantity {
	if m.Spec.Memory.IsZero() {
		return resource.MustParse(defaultMachineMemory)
	}
	return m.Spec.Memory.DeepCopy()
}

// Resources is an amount of vCPUs and bytes of memory, the two things a
// Machine takes from a node.
type Resources struct {
	CPU    int64
	Memory int64
}

func (r Resources) Add(o Resources) Resources {
	return Resources{CPU: r.CPU + o.CPU, Memory: r.Memory + o.Memory}
}

func (r Resources) Sub(o Resources) Resources {
	return Resources{CPU: r.CPU - o.CPU, Memory: r.Memory - o.Memory}
}

func MachineResources(m *kaironv1.Machine) Resources {
	memory := MachineMemory(m)
	return Resources{CPU: int64(MachineCPU(m)), Memory: memory.Value()}
}

// NodeAllocatable reads the Node's allocatable, what the kubelet (or
// kairon-node, without one) offers to everything on it. Machines get what
// the pods bound there leave (NodeInfo.ForMachines). Fractional CPUs are
// rounded down: a vCPU is a whole host thread.
func NodeAllocatable(node *corev1.Node) Resources {
	var r Resources
	if cpu, ok := node.Status.Allocatable[corev1.ResourceCPU]; ok {
		r.CPU = cpu.MilliValue() / 1000
	}
	if memory, ok := node.Status.Allocatable[corev1.ResourceMemory]; ok {
		r.Memory = memory.Value()
	}
	return r
}

// HoldsNodeResources says whether a placed Machine still takes its node's
// CPU and memory. A Machine being deleted still does: its VM runs until the
// node agent has stopped it.
func HoldsNodeResources(m *kaironv1.Machine) bool {
	return m.Spec.NodeName != "" && m.Status.Phase != kaironv1.MachineStopped && m.Status.Phase != kaironv1.MachineFailed
}

func FormatMemory(q resource.Quantity) string {
	return FormatBytes(q.Value())
}

// FormatBytes prints memory the way people write it in manifests (256Mi,
// 8Gi), falling back to one decimal for amounts that are not whole.
func FormatBytes(b int64) string {
	const (
		ki = int64(1) << 10
		mi = ki << 10
		gi = mi << 10
	)
	abs := b
	if abs < 0 {
		abs = -abs
	}
	switch {
	case b == 0:
		return "0"
	case abs%gi == 0:
		return fmt.Sprintf("%dGi", b/gi)
	case abs%mi == 0:
		return fmt.Sprintf("%dMi", b/mi)
	case abs >= gi:
		return fmt.Sprintf("%.1fGi", float64(b)/float64(gi))
	case abs >= mi:
		return fmt.Sprintf("%.1fMi", float64(b)/float64(mi))
	case abs%ki == 0:
		return fmt.Sprintf("%dKi", b/ki)
	}
	return fmt.Sprint(b)
}
