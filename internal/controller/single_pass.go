package controller

import (
	"context"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/zyvor/kairon/internal/requeue"
)

// singlePass registers r as a controller named name whose queue only ever
// holds key: for reconcilers whose decisions depend on each other, every
// event asks for one pass over everything, the workqueue folds a burst of
// events into one pass, and passes never overlap. watch adds the
// controller's watches, each enqueuing through the handler it is given.
// The request names no object, so it is left out of every log line.
func singlePass(mgr manager.Manager, name string, key reconcile.Request, r reconcile.Reconciler,
	watch func(b *builder.Builder, enqueuePass handler.EventHandler) *builder.Builder) error {
	b := builder.ControllerManagedBy(mgr).
		Named(name).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		WithLogConstructor(func(*reconcile.Request) logr.Logger {
			return mgr.GetLogger().WithValues("controller", name)
		})
	return watch(b, passHandler(key)).Complete(requeue.UntilStopped(r))
}

// passHandler maps every event, whatever its object, to key.
func passHandler(key reconcile.Request) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{key}
	})
}
