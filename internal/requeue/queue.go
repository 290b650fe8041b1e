// Package requeue holds how the controllers of Kairon's managers queue
// their work.
package requeue

import (
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
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
//
// Each controller also takes its queue from NewQueue (Options), which
// this configuration cannot set for all of them.
func ControllerConfig() config.Controller {
	return config.Controller{UsePriorityQueue: ptr.To(false)}
}

// Options is o with the queue every Kairon controller uses (NewQueue).
func Options(o controller.Options) controller.Options {
	o.NewQueue = NewQueue[reconcile.Request]
	return o
}

// NewQueue makes a controller's queue: client-go's rate-limited queue, in
// arrival order (ControllerConfig says why), which hands out nothing more
// once it is shut down.
//
// client-go's queue goes on handing out what it holds after ShutDown, so
// a controller's workers would run every queued reconcile after the stop
// signal, with a cancelled context: a screen of "context canceled" errors
// at every stop, and, in kairon-node, kernel state (nftables, routes,
// taps) written after the agent tore its own down. controller-runtime's
// priority queue stops at once; this one does too.
func NewQueue[T comparable](name string, limiter workqueue.TypedRateLimiter[T]) workqueue.TypedRateLimitingInterface[T] {
	return doneAtShutdown[T]{workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[T]{Name: name})}
}

type doneAtShutdown[T comparable] struct {
	workqueue.TypedRateLimitingInterface[T]
}

func (q doneAtShutdown[T]) Get() (T, bool) {
	item, shutdown := q.TypedRateLimitingInterface.Get()
	if !shutdown && q.ShuttingDown() {
		// Taken off the queue, never worked on.
		q.Done(item)
		var zero T
		return zero, true
	}
	return item, shutdown
}
