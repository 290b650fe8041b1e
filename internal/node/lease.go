package node

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/zyvor/kairon/internal/rules"
)

// renewLease keeps the agent's Lease (kube-node-lease/kairon-<node>)
// fresh, as a kubelet keeps its own: kairon-controller judges the node by
// it (nodehealth_controller.go). It renews at once, then every
// LeaseRenewInterval, and leaves the Lease as it is when the agent stops:
// the node is unreachable once the grace runs out, whether the agent
// stopped or died.
func (a *Agent) renewLease(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("lease")
	renew := func() {
		if err := a.syncLease(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "renewing the node lease")
		}
	}
	renew()
	ticker := time.NewTicker(a.opts.LeaseRenewInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			renew()
		}
	}
}

// syncLease creates the Lease or moves its renewTime to now. It reads past
// the cache: the agent caches only its own Machines.
func (a *Agent) syncLease(ctx context.Context) error {
	key := client.ObjectKey{Namespace: rules.NodeLeaseNamespace, Name: rules.NodeLeaseName(a.opts.NodeName)}
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{}
	err := a.mgr.GetAPIReader().Get(ctx, key, lease)
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(a.opts.NodeName),
				LeaseDurationSeconds: ptr.To(int32(rules.DefaultNodeGracePeriod / time.Second)),
				RenewTime:            &now,
			},
		}
		return a.client.Create(ctx, lease)
	}
	if err != nil {
		return err
	}
	lease.Spec.HolderIdentity = ptr.To(a.opts.NodeName)
	lease.Spec.RenewTime = &now
	// An update, not a patch: a lost race with another writer is a
	// conflict, and the next tick renews.
	return a.client.Update(ctx, lease)
}
