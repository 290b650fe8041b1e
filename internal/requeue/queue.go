package requeue

import (
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/config"
)

// ControllerConfig is the controller configuration every manager of
// Kairon's (kairon-controller's, kairon-node's) is built with: first in,
// first out queues, not controller-runtime's priority queue, its default.
//
// The priority queue puts the objects of an informer's initial list, that
// is every object after a restart, behind every change, and a reconcile's
// requeue (a timer, an error retry) keeps the priority of what it requeues.
// A low item is served only when no change is ready, so while changes keep
// coming (a claim storm, a large cluster's status reports) an object that
// did not change since the restart waits, unreconciled, however long they
// last: a claim whose bind was written to its Machine but not to its
// status is never adopted, a node's Machine never reported. That is run
// i's lost claim in docs/benchmarks.md; controller-runtime issue #3496
// reports the same starvation. A restart costs every object one reconcile
// either way, and with the queues in arrival order each gets it in turn.
func ControllerConfig() config.Controller {
	return config.Controller{UsePriorityQueue: ptr.To(false)}
}
