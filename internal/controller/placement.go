package controller

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// noNodesMessage is what a Pending Machine says when there is nowhere at all
// to run it, which on a fresh install means the node agent is not running.
const noNodesMessage = "no nodes labelled " + kaironv1.LabelNode + ": start kairon-node"

// nodeInfo is one Kairon node during a scheduling pass: what it offers and
// what the Machines placed on it already take.
type nodeInfo struct {
	node        *corev1.Node
	allocatable resources
	requested   resources
}

func newNodeInfo(node *corev1.Node) *nodeInfo {
	return &nodeInfo{node: node, allocatable: nodeAllocatable(node)}
}

func (n *nodeInfo) free() resources { return n.allocatable.sub(n.requested) }

// nodeRejection is why one node cannot take a Machine. The order is the
// order reasons appear in a Pending Machine's message.
type nodeRejection int

const (
	rejectNotReady nodeRejection = iota
	rejectDeleting
	rejectCordoned
	rejectNodeSelector
	rejectInsufficientCPU
	rejectInsufficientMemory
	rejectionKinds
)

// nodeRejections is why a node cannot take a Machine; empty means it fits.
// Like kube-scheduler, a node that is unusable for a reason other than room
// reports only that reason, while a node short of both CPU and memory
// reports both.
func nodeRejections(n *nodeInfo, m *kaironv1.Machine) []nodeRejection {
	switch {
	case !nodeReady(n.node):
		return []nodeRejection{rejectNotReady}
	case n.node.DeletionTimestamp != nil:
		return []nodeRejection{rejectDeleting}
	case n.node.Spec.Unschedulable:
		return []nodeRejection{rejectCordoned}
	case !labels.SelectorFromSet(m.Spec.NodeSelector).Matches(labels.Set(n.node.Labels)):
		return []nodeRejection{rejectNodeSelector}
	}
	var rejections []nodeRejection
	need, free := machineResources(m), n.free()
	if need.CPU > free.CPU {
		rejections = append(rejections, rejectInsufficientCPU)
	}
	if need.Memory > free.Memory {
		rejections = append(rejections, rejectInsufficientMemory)
	}
	return rejections
}

func nodeReady(node *corev1.Node) bool {
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
func nodeScore(n *nodeInfo, m *kaironv1.Machine) float64 {
	left := n.free().sub(machineResources(m))
	return (fraction(left.CPU, n.allocatable.CPU) + fraction(left.Memory, n.allocatable.Memory)) / 2
}

func fraction(part, whole int64) float64 {
	if whole <= 0 {
		return 0
	}
	return float64(part) / float64(whole)
}

// pickNode chooses the node for m: among those it fits, the one left with
// the most free capacity, ties broken by name so the choice is stable. With
// no fit it returns nil and a kube-scheduler style account of why.
func pickNode(nodes []*nodeInfo, m *kaironv1.Machine) (*nodeInfo, string) {
	if len(nodes) == 0 {
		return nil, noNodesMessage
	}
	var (
		best      *nodeInfo
		bestScore float64
		report    rejectionReport
	)
	for _, n := range nodes {
		if rejections := nodeRejections(n, m); len(rejections) > 0 {
			report.add(n, rejections)
			continue
		}
		score := nodeScore(n, m)
		if best == nil || score > bestScore || (score == bestScore && n.node.Name < best.node.Name) {
			best, bestScore = n, score
		}
	}
	if best != nil {
		return best, ""
	}
	return nil, report.message(len(nodes), machineResources(m))
}

// rejectionReport tallies why nodes turned a Machine down.
type rejectionReport struct {
	count [rejectionKinds]int
	// mostFree is the largest free amount among the nodes short of it, so
	// the message says how close the best node came.
	mostFree resources
}

func (r *rejectionReport) add(n *nodeInfo, rejections []nodeRejection) {
	free := n.free()
	for _, rejection := range rejections {
		switch rejection {
		case rejectInsufficientCPU:
			if r.count[rejection] == 0 || free.CPU > r.mostFree.CPU {
				r.mostFree.CPU = free.CPU
			}
		case rejectInsufficientMemory:
			if r.count[rejection] == 0 || free.Memory > r.mostFree.Memory {
				r.mostFree.Memory = free.Memory
			}
		}
		r.count[rejection]++
	}
}

// message reads like kube-scheduler's:
//
//	0/3 nodes are available: 1 node is cordoned, 1 node does not match spec.nodeSelector, 1 node has insufficient memory (free 128Mi, need 256Mi)
func (r *rejectionReport) message(total int, need resources) string {
	var parts []string
	for kind := range rejectionKinds {
		n := r.count[kind]
		if n == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%d %s", n, rejectionPhrase(kind, n, r.mostFree, need)))
	}
	return fmt.Sprintf("0/%d nodes are available: %s", total, strings.Join(parts, ", "))
}

func rejectionPhrase(kind nodeRejection, n int, mostFree, need resources) string {
	// With several nodes short, the free amount quoted is the best of them.
	freeWord := "free"
	if n > 1 {
		freeWord = "most free"
	}
	switch kind {
	case rejectNotReady:
		return plural(n, "node is not ready", "nodes are not ready")
	case rejectDeleting:
		return plural(n, "node is being deleted", "nodes are being deleted")
	case rejectCordoned:
		return plural(n, "node is cordoned", "nodes are cordoned")
	case rejectNodeSelector:
		return plural(n, "node does not match spec.nodeSelector", "nodes do not match spec.nodeSelector")
	case rejectInsufficientCPU:
		return fmt.Sprintf("%s insufficient cpu (%s %d, need %d)", plural(n, "node has", "nodes have"), freeWord, max(mostFree.CPU, 0), need.CPU)
	case rejectInsufficientMemory:
		return fmt.Sprintf("%s insufficient memory (%s %s, need %s)", plural(n, "node has", "nodes have"), freeWord, formatBytes(max(mostFree.Memory, 0)), formatBytes(need.Memory))
	}
	return "nodes rejected for an unknown reason"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// sortByAge orders Machines oldest first, the order the scheduler admits
// them in, with the name as tie breaker because creation timestamps only
// have one-second resolution.
func sortByAge(machines []*kaironv1.Machine) {
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

// chargeNodes adds to each node what the Machines on it take, and what
// Running migrations are bringing to it: from the moment its target is
// picked until the switch of spec.nodeName, a migrating Machine holds room
// on both nodes, so neither the scheduler nor another migration may hand
// that room out twice.
func chargeNodes(byName map[string]*nodeInfo, machines []*kaironv1.Machine, migrations []kaironv1.MachineMigration) {
	byKey := make(map[string]*kaironv1.Machine, len(machines))
	for _, m := range machines {
		byKey[m.Namespace+"/"+m.Name] = m
		if !holdsNodeResources(m) {
			continue
		}
		if n := byName[m.Spec.NodeName]; n != nil {
			n.requested = n.requested.add(machineResources(m))
		}
	}
	for i := range migrations {
		mig := &migrations[i]
		if mig.Status.Phase != kaironv1.MigrationRunning || mig.Status.TargetNode == "" {
			continue
		}
		m := byKey[mig.Namespace+"/"+mig.Spec.MachineName]
		if m == nil || !holdsNodeResources(m) || m.Spec.NodeName == mig.Status.TargetNode {
			continue // gone, or already switched and charged above
		}
		if n := byName[mig.Status.TargetNode]; n != nil {
			n.requested = n.requested.add(machineResources(m))
		}
	}
}
