package rules

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// NoNodesMessage is what a Pending Machine says when there is nowhere at all
// to run it, which on a fresh install means the node agent is not running.
const NoNodesMessage = "no nodes labelled " + kaironv1.LabelNode + ": start kairon-node"

// NodeInfo is one Kairon node during a scheduling pass: what it offers,
// what the pods bound to it request (ChargePods) and what the Machines
// placed on it already take (ChargeNodes).
type NodeInfo struct {
	Node        *corev1.Node
	Allocatable Resources
	Pods        PodRequests
	Requested   Resources
}

func NewNodeInfo(node *corev1.Node) *NodeInfo {
	return &NodeInfo{Node: node, Allocatable: NodeAllocatable(node)}
}

// Free is what is left for another Machine: allocatable, less the pods,
// less the Machines.
func (n *NodeInfo) Free() Resources { return n.ForMachines().Sub(n.Requested) }

// nodeRejection is why one node cannot take a Machine. The order is the
// order reasons appear in a Pending Machine's message.
type nodeRejection int

const (
	rejectFenced nodeRejection = iota
	rejectNotReady
	rejectUnreachable
	rejectDeleting
	rejectCordoned
	rejectNodeSelector
	rejectInsufficientCPU
	rejectInsufficientMemory
	rejectionKinds
)

// NodeRejections is why a node cannot take a Machine; empty means it fits.
// Like kube-scheduler, a node that is unusable for a reason other than room
// reports only that reason, while a node short of both CPU and memory
// reports both.
func NodeRejections(n *NodeInfo, m *kaironv1.Machine) []nodeRejection {
	switch {
	case NodeFenced(n.Node):
		return []nodeRejection{rejectFenced}
	case !NodeReady(n.Node):
		return []nodeRejection{rejectNotReady}
	case !NodeAgentReachable(n.Node):
		return []nodeRejection{rejectUnreachable}
	case n.Node.DeletionTimestamp != nil:
		return []nodeRejection{rejectDeleting}
	case n.Node.Spec.Unschedulable:
		return []nodeRejection{rejectCordoned}
	case !labels.SelectorFromSet(m.Spec.NodeSelector).Matches(labels.Set(n.Node.Labels)):
		return []nodeRejection{rejectNodeSelector}
	}
	var rejections []nodeRejection
	need, free := MachineResources(m), n.Free()
	if need.CPU > free.CPU {
		rejections = append(rejections, rejectInsufficientCPU)
	}
	if need.Memory > free.Memory {
		rejections = append(rejections, rejectInsufficientMemory)
	}
	return rejections
}

func NodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// nodeScore is the fraction of the node that stays free once m runs there,
// averaged over CPU and memory. Higher is better: picking the emptiest node
// spreads Machines, so one node failing takes down as few as possible.
func nodeScore(n *NodeInfo, m *kaironv1.Machine) float64 {
	left := n.Free().Sub(MachineResources(m))
	return (fraction(left.CPU, n.Allocatable.CPU) + fraction(left.Memory, n.Allocatable.Memory)) / 2
}

func fraction(part, whole int64) float64 {
	if whole <= 0 {
		return 0
	}
	return float64(part) / float64(whole)
}

// PickNode chooses the node for m: among those it fits, the one left with
// the most free capacity, ties broken by name so the choice is stable. With
// no fit it returns nil and a kube-scheduler style account of why.
func PickNode(nodes []*NodeInfo, m *kaironv1.Machine) (*NodeInfo, string) {
	if len(nodes) == 0 {
		return nil, NoNodesMessage
	}
	var (
		best      *NodeInfo
		bestScore float64
		report    RejectionReport
	)
	for _, n := range nodes {
		if rejections := NodeRejections(n, m); len(rejections) > 0 {
			report.Add(n, rejections)
			continue
		}
		score := nodeScore(n, m)
		if best == nil || score > bestScore || (score == bestScore && n.Node.Name < best.Node.Name) {
			best, bestScore = n, score
		}
	}
	if best != nil {
		return best, ""
	}
	return nil, report.Message(len(nodes), MachineResources(m))
}

// RejectionReport tallies why nodes turned a Machine down.
type RejectionReport struct {
	count [rejectionKinds]int
	// mostFree is the largest free amount among the nodes short of it, so
	// the message says how close the best node came.
	mostFree Resources
	// podsOnMostFree is what the pods on that node request, so a
	// message about a node full of pods says so.
	podsOnMostFree PodRequests
}

func (r *RejectionReport) Add(n *NodeInfo, rejections []nodeRejection) {
	free := n.Free()
	for _, rejection := range rejections {
		switch rejection {
		case rejectInsufficientCPU:
			if r.count[rejection] == 0 || free.CPU > r.mostFree.CPU {
				r.mostFree.CPU = free.CPU
				r.podsOnMostFree.MilliCPU = n.Pods.MilliCPU
			}
		case rejectInsufficientMemory:
			if r.count[rejection] == 0 || free.Memory > r.mostFree.Memory {
				r.mostFree.Memory = free.Memory
				r.podsOnMostFree.Memory = n.Pods.Memory
			}
		}
		r.count[rejection]++
	}
}

// message reads like kube-scheduler's:
//
//	0/3 nodes are available: 1 node is cordoned, 1 node does not match spec.nodeSelector, 1 node has insufficient memory (free 128Mi, need 256Mi)
//
// A node that pods take room on says how much, since that room is not
// visible among the Machines:
//
//	0/1 nodes are available: 1 node has insufficient memory (free 1Gi, need 2Gi; pods on it request 3Gi)
func (r *RejectionReport) Message(total int, need Resources) string {
	var parts []string
	for kind := range rejectionKinds {
		n := r.count[kind]
		if n == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%d %s", n, rejectionPhrase(kind, n, r.mostFree, r.podsOnMostFree, need)))
	}
	return fmt.Sprintf("0/%d nodes are available: %s", total, strings.Join(parts, ", "))
}

func rejectionPhrase(kind nodeRejection, n int, mostFree Resources, pods PodRequests, need Resources) string {
	// With several nodes short, the free amount quoted is the best of them.
	freeWord, podsWord := "free", "pods on it request"
	if n > 1 {
		freeWord, podsWord = "most free", "pods on that node request"
	}
	switch kind {
	case rejectFenced:
		return plural(n, "node is fenced", "nodes are fenced")
	case rejectNotReady:
		return plural(n, "node is not ready", "nodes are not ready")
	case rejectUnreachable:
		return plural(n, "node's agent is unreachable", "nodes' agents are unreachable")
	case rejectDeleting:
		return plural(n, "node is being deleted", "nodes are being deleted")
	case rejectCordoned:
		return plural(n, "node is cordoned", "nodes are cordoned")
	case rejectNodeSelector:
		return plural(n, "node does not match spec.nodeSelector", "nodes do not match spec.nodeSelector")
	case rejectInsufficientCPU:
		podsPart := ""
		if pods.MilliCPU > 0 {
			podsPart = fmt.Sprintf("; %s %s", podsWord, FormatMilliCPU(pods.MilliCPU))
		}
		return fmt.Sprintf("%s insufficient cpu (%s %d, need %d%s)", plural(n, "node has", "nodes have"), freeWord, max(mostFree.CPU, 0), need.CPU, podsPart)
	case rejectInsufficientMemory:
		podsPart := ""
		if pods.Memory > 0 {
			podsPart = fmt.Sprintf("; %s %s", podsWord, FormatBytes(pods.Memory))
		}
		return fmt.Sprintf("%s insufficient memory (%s %s, need %s%s)", plural(n, "node has", "nodes have"), freeWord, FormatBytes(max(mostFree.Memory, 0)), FormatBytes(need.Memory), podsPart)
	}
	return "nodes rejected for an unknown reason"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// SortByAge orders Machines oldest first, the order the scheduler admits
// them in, with the name as tie breaker because creation timestamps only
// have one-second resolution.
func SortByAge(machines []*kaironv1.Machine) {
	sort.SliceStable(machines, func(i, j int) bool {
		a, b := machines[i], machines[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
}

// ChargeNodes adds to each node what the Machines on it take, and what
// Running migrations are bringing to it: from the moment its target is
// picked until the switch of spec.nodeName, a migrating Machine holds room
// on both nodes, so neither the scheduler nor another migration may hand
// that room out twice.
func ChargeNodes(byName map[string]*NodeInfo, machines []*kaironv1.Machine, migrations []kaironv1.MachineMigration) {
	byKey := make(map[string]*kaironv1.Machine, len(machines))
	for _, m := range machines {
		byKey[m.Namespace+"/"+m.Name] = m
		if !HoldsNodeResources(m) {
			continue
		}
		if n := byName[m.Spec.NodeName]; n != nil {
			n.Requested = n.Requested.Add(MachineResources(m))
		}
	}
	for i := range migrations {
		mig := &migrations[i]
		if mig.Status.Phase != kaironv1.MigrationRunning || mig.Status.TargetNode == "" {
			continue
		}
		m := byKey[mig.Namespace+"/"+mig.Spec.MachineName]
		if m == nil || !HoldsNodeResources(m) || m.Spec.NodeName == mig.Status.TargetNode {
			continue // gone, or already switched and charged above
		}
		if n := byName[mig.Status.TargetNode]; n != nil {
			n.Requested = n.Requested.Add(MachineResources(m))
		}
	}
}
