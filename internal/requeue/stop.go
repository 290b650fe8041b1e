package requeue

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// UntilStopped is r, run only while its controller runs: a reconcile that
// would start after the stop signal does nothing instead.
//
// A controller's workers go on taking work from its queue after the stop
// signal, each with the stop's cancelled context: client-go's queue hands
// out what it holds until ShutDown, and goes on after it, and
// controller-runtime shuts it down from a goroutine of its own that a
// worker can beat to every queued item. Every queued reconcile would then
// run: a screen of "Reconciler error ... context canceled" at each stop,
// and, in kairon-node, work begun on nftables, routes or taps after the
// agent tore its own down. The work is not lost: after a restart every
// object is reconciled from the initial list.
func UntilStopped(r reconcile.Reconciler) reconcile.Reconciler {
	return UntilStoppedTyped(r)
}

// UntilStoppedTyped is UntilStopped for a controller whose requests are
// of type T.
func UntilStoppedTyped[T comparable](r reconcile.TypedReconciler[T]) reconcile.TypedReconciler[T] {
	return reconcile.TypedFunc[T](func(ctx context.Context, req T) (reconcile.Result, error) {
		if ctx.Err() != nil {
			return reconcile.Result{}, nil
		}
		return r.Reconcile(ctx, req)
	})
}
