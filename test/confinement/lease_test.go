package confinement_test

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func nodeLease(ns, name, holder string) *coordinationv1.Lease {
	now := metav1.NewMicroTime(time.Now())
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(int32(40)), RenewTime: &now},
	}
}

// An agent creates and renews its own node Lease, kube-node-lease/
// kairon-<node>, and no other: not another agent's (a compromised node
// could keep a dead one looking alive), not a kubelet's, nor one in another
// namespace.
func TestAgentLeaseConfinement(t *testing.T) {
	cp := controlPlane(t)
	ctx := context.Background()
	adm := admin(t, cp)
	makeNode(t, adm, "lease-a")
	makeNode(t, adm, "lease-b")
	a := agent(t, cp, "lease-a")

	own := nodeLease("kube-node-lease", "kairon-lease-a", "lease-a")
	allowed(t, "agent creates its own lease", a.Create(ctx, own))
	var got coordinationv1.Lease
	allowed(t, "agent reads its own lease", a.Get(ctx, client.ObjectKeyFromObject(own), &got))
	now := metav1.NewMicroTime(time.Now())
	got.Spec.RenewTime = &now
	allowed(t, "agent renews its own lease", a.Update(ctx, &got))

	refused(t, "agent creates another agent's lease",
		a.Create(ctx, nodeLease("kube-node-lease", "kairon-lease-b", "lease-a")), "may write only the Lease kube-node-lease/kairon-lease-a")
	refused(t, "agent creates the kubelet's lease",
		a.Create(ctx, nodeLease("kube-node-lease", "lease-a", "lease-a")), "may write only the Lease kube-node-lease/kairon-lease-a")
	refused(t, "agent creates its lease name in another namespace",
		a.Create(ctx, nodeLease("kube-system", "kairon-lease-a", "lease-a")), "may write only the Lease kube-node-lease/kairon-lease-a")

	other := nodeLease("kube-node-lease", "kairon-lease-b", "lease-b")
	allowed(t, "admin creates b's lease", adm.Create(ctx, other))
	var theirs coordinationv1.Lease
	allowed(t, "agent reads b's lease", a.Get(ctx, client.ObjectKeyFromObject(other), &theirs))
	theirs.Spec.RenewTime = &now
	refused(t, "agent renews b's lease", a.Update(ctx, &theirs), "may write only the Lease kube-node-lease/kairon-lease-a")
}
