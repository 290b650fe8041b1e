// Package requeue holds how Kairon's controllers put work back on their
// queues.
package requeue

import (
	"context"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// NormalPriority is the priority of an object's change on a
// controller-runtime priority queue.
const NormalPriority = 0

// AtNormalPriority has r's own requeues, on a timer or after an error, wait
// at NormalPriority rather than at the priority of the event that ran it.
//
// controller-runtime's priority queue (its default) queues the objects of
// an informer's initial list, that is every object after a restart, at a
// low priority, so that changes go first; and a requeue keeps the priority
// of the item it requeues. An object that does not change after a restart
// therefore stays low for good, and while changes keep the queue busy its
// timed work never runs: a claim whose bind was written to its Machine but
// not to its status waited minutes, unadopted, in a 2,000-claim storm
// (docs/benchmarks.md; controller-runtime issue #3496). A requeue is the
// controller saying work is due, so it waits like a change.
func AtNormalPriority(r reconcile.Reconciler) reconcile.Reconciler {
	return reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		res, err := r.Reconcile(ctx, req)
		if res.Priority == nil {
			res.Priority = ptr.To(NormalPriority)
		}
		return res, err
	})
}
