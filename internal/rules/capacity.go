package rules

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// A Kairon node is usually also a kubelet's node: the node agent's own pod,
// DaemonSets and whatever else kube-scheduler put there take part of the
// allocatable the Node reports. Kairon's VMs run outside every pod, so the
// kubelet does not see them; the two schedulers book the same memory once
// only if Kairon subtracts the pods (ChargePods) and the pods' side sees the
// VMs (a booking pod per Machine, internal/controller/capacity_booking.go).

// LabelCapacityBooking marks the pod that books a Machine's CPU and memory
// with the kubelet and kube-scheduler. Such a pod stands for a Machine the
// scheduler already charges, so ChargePods leaves it out.
const LabelCapacityBooking = "kairon.zyvor.dev/capacity-booking"

// PodRequests is what pods ask of a node, in the units pods use: CPU in
// millicores, memory in bytes.
type PodRequests struct {
	MilliCPU int64
	Memory   int64
}

func (p PodRequests) Add(o PodRequests) PodRequests {
	return PodRequests{MilliCPU: p.MilliCPU + o.MilliCPU, Memory: p.Memory + o.Memory}
}

// IsBookingPod says whether pod is a Machine's booking pod: labelled so and
// controlled by a Machine. Both are asked for so that a pod merely carrying
// the label is still counted.
func IsBookingPod(pod *corev1.Pod) bool {
	if pod.Labels[LabelCapacityBooking] != "true" {
		return false
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Controller != nil && *ref.Controller && ref.Kind == "Machine" && ref.APIVersion == kaironv1.GroupVersion.String() {
			return true
		}
	}
	return false
}

// PodHoldsNodeResources says whether pod takes room on its node the way
// kube-scheduler and the kubelet count it: bound, and neither Succeeded nor
// Failed. A pod being deleted still does until its containers are gone.
func PodHoldsNodeResources(pod *corev1.Pod) bool {
	return pod.Spec.NodeName != "" && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// EffectivePodRequests is what kube-scheduler charges a node for pod: the
// larger of the containers (with sidecars) and the most demanding init
// step, pod-level requests where set, plus the RuntimeClass overhead.
func EffectivePodRequests(pod *corev1.Pod) PodRequests {
	var containers, sidecars, initPeak PodRequests
	for i := range pod.Spec.Containers {
		containers = containers.Add(containerRequests(&pod.Spec.Containers[i]))
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		step := containerRequests(c)
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			// A sidecar keeps running next to the containers and to
			// every init container after it.
			containers = containers.Add(step)
			sidecars = sidecars.Add(step)
			step = sidecars
		} else {
			step = step.Add(sidecars)
		}
		initPeak = PodRequests{MilliCPU: max(initPeak.MilliCPU, step.MilliCPU), Memory: max(initPeak.Memory, step.Memory)}
	}
	total := PodRequests{MilliCPU: max(containers.MilliCPU, initPeak.MilliCPU), Memory: max(containers.Memory, initPeak.Memory)}
	if pod.Spec.Resources != nil {
		if q, ok := pod.Spec.Resources.Requests[corev1.ResourceCPU]; ok {
			total.MilliCPU = q.MilliValue()
		}
		if q, ok := pod.Spec.Resources.Requests[corev1.ResourceMemory]; ok {
			total.Memory = q.Value()
		}
	}
	return total.Add(listRequests(pod.Spec.Overhead))
}

// containerRequests are c's requests; a container with only limits is
// requested at its limits, as the API server defaults it.
func containerRequests(c *corev1.Container) PodRequests {
	r := listRequests(c.Resources.Requests)
	if _, ok := c.Resources.Requests[corev1.ResourceCPU]; !ok {
		r.MilliCPU = listRequests(c.Resources.Limits).MilliCPU
	}
	if _, ok := c.Resources.Requests[corev1.ResourceMemory]; !ok {
		r.Memory = listRequests(c.Resources.Limits).Memory
	}
	return r
}

func listRequests(list corev1.ResourceList) PodRequests {
	var r PodRequests
	if q, ok := list[corev1.ResourceCPU]; ok {
		r.MilliCPU = q.MilliValue()
	}
	if q, ok := list[corev1.ResourceMemory]; ok {
		r.Memory = q.Value()
	}
	return r
}

// ChargePods adds to each node what the pods bound to it request, leaving
// out Kairon's own booking pods: the Machine each one stands for is charged
// by ChargeNodes already, and counting both would book it twice.
func ChargePods(byName map[string]*NodeInfo, pods []corev1.Pod) {
	for i := range pods {
		pod := &pods[i]
		if !PodHoldsNodeResources(pod) || IsBookingPod(pod) {
			continue
		}
		if n := byName[pod.Spec.NodeName]; n != nil {
			n.Pods = n.Pods.Add(EffectivePodRequests(pod))
		}
	}
}

// ForMachines is what the node offers Machines: its allocatable less what
// the pods on it request. CPU is rounded down to whole vCPUs after the
// pods' millicores are taken, so a 100m agent pod on a 4-CPU node leaves 3.
func (n *NodeInfo) ForMachines() Resources {
	if n.Pods == (PodRequests{}) || n.Node == nil {
		return n.Allocatable
	}
	milli := nodeAllocatableMilliCPU(n.Node) - n.Pods.MilliCPU
	return Resources{CPU: floorDiv(milli, 1000), Memory: n.Allocatable.Memory - n.Pods.Memory}
}

func nodeAllocatableMilliCPU(node *corev1.Node) int64 {
	if cpu, ok := node.Status.Allocatable[corev1.ResourceCPU]; ok {
		return cpu.MilliValue()
	}
	return 0
}

// floorDiv rounds toward minus infinity, so a node whose pods ask for more
// CPU than it has reports less than zero vCPUs rather than zero.
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// FormatMilliCPU prints CPU the way pods write it: whole CPUs as a number,
// anything else in millicores.
func FormatMilliCPU(milli int64) string {
	if milli%1000 == 0 {
		return fmt.Sprint(milli / 1000)
	}
	return resource.NewMilliQuantity(milli, resource.DecimalSI).String()
}
