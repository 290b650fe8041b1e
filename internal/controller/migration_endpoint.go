package controller

import (
	"context"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/requeue"
)

// MigrationEndpointReconciler owns the Node annotation
// kairon.zyvor.dev/migration-endpoint, where source agents send guests and
// target agents fetch saved states. An agent only publishes the port it
// listens on (kairon.zyvor.dev/migration-port, on its own Node); the host
// is the Node's InternalIP. Were the agents to write the endpoint, a
// compromised one could point migrations at a host of its choosing; it
// would still need the target node's certificate, but it would also learn
// who migrates what, and could make migrations fail at will.
type MigrationEndpointReconciler struct {
	Client client.Client
}

// SetupWithManager registers the reconciler with mgr.
func (r *MigrationEndpointReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return builder.ControllerManagedBy(mgr).
		Named("migration-endpoint").
		For(&corev1.Node{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			// Nodes of a kubelet-only cluster part are none of its business,
			// except to remove an endpoint someone else wrote there.
			_, port := o.GetAnnotations()[kaironv1.AnnotationNodeMigrationPort]
			_, endpoint := o.GetAnnotations()[kaironv1.AnnotationNodeMigrationEndpoint]
			return port || endpoint
		}))).
		Complete(requeue.UntilStopped(r))
}

// Reconcile writes, corrects or removes one Node's migration endpoint.
func (r *MigrationEndpointReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, req.NamespacedName, node); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	want := MigrationEndpointFor(node)
	got, has := node.Annotations[kaironv1.AnnotationNodeMigrationEndpoint]
	if (want == "" && !has) || (want != "" && got == want) {
		return reconcile.Result{}, nil
	}
	base := node.DeepCopy()
	if want == "" {
		delete(node.Annotations, kaironv1.AnnotationNodeMigrationEndpoint)
	} else {
		if node.Annotations == nil {
			node.Annotations = map[string]string{}
		}
		node.Annotations[kaironv1.AnnotationNodeMigrationEndpoint] = want
	}
	// Optimistic lock: the InternalIP or the port read above must still be
	// the Node's when the endpoint is written.
	return reconcile.Result{}, client.IgnoreNotFound(r.Client.Patch(ctx, node, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})))
}

// MigrationEndpointFor is the migration endpoint a Node should advertise:
// its first InternalIP and the port its agent published, or "" when either
// is missing or malformed (then migrations to and from it fail with a
// clear reason instead of reaching some other host).
func MigrationEndpointFor(node *corev1.Node) string {
	port, err := strconv.ParseUint(node.Annotations[kaironv1.AnnotationNodeMigrationPort], 10, 16)
	if err != nil || port == 0 {
		return ""
	}
	for _, addr := range node.Status.Addresses {
		if addr.Type != corev1.NodeInternalIP {
			continue
		}
		ip := net.ParseIP(addr.Address)
		if ip == nil || ip.IsUnspecified() || ip.IsMulticast() {
			return ""
		}
		return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10))
	}
	return ""
}
