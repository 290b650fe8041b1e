package confinement_test

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
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

// With --cluster-guest-cidr an agent claims its guest subnet with a Lease
// of its own making: held by its node, owned by its Node. It may claim for
// itself only, and may not take over a claim that exists.
func TestAgentGuestSubnetClaimConfinement(t *testing.T) {
	cp := controlPlane(t)
	ctx := context.Background()
	adm := admin(t, cp)
	nodeA := makeNode(t, adm, "subnet-a")
	nodeB := makeNode(t, adm, "subnet-b")
	a := agent(t, cp, "subnet-a")
	claim := func(name, holder string, owner *corev1.Node) *coordinationv1.Lease {
		l := nodeLease("kube-node-lease", name, holder)
		if owner != nil {
			l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: owner.Name, UID: owner.UID}}
		}
		return l
	}
	const want = "create guest subnet claims (kairon-guest-subnet-*) held by and owned by its own Node"

	own := claim("kairon-guest-subnet-10-89-1-0-24", "subnet-a", nodeA)
	allowed(t, "agent claims a subnet for its node", a.Create(ctx, own))
	refused(t, "agent claims a subnet for another node",
		a.Create(ctx, claim("kairon-guest-subnet-10-89-2-0-24", "subnet-b", nodeB)), want)
	refused(t, "agent claims a subnet held by itself but owned by another Node",
		a.Create(ctx, claim("kairon-guest-subnet-10-89-3-0-24", "subnet-a", nodeB)), want)
	refused(t, "agent claims a subnet owned by nothing (never collected)",
		a.Create(ctx, claim("kairon-guest-subnet-10-89-4-0-24", "subnet-a", nil)), want)

	var got coordinationv1.Lease
	allowed(t, "agent reads its claim", a.Get(ctx, client.ObjectKeyFromObject(own), &got))
	got.Spec.HolderIdentity = ptr.To("subnet-a")
	now := metav1.NewMicroTime(time.Now())
	got.Spec.RenewTime = &now
	refused(t, "agent updates a claim", a.Update(ctx, &got), want)

	theirs := claim("kairon-guest-subnet-10-89-5-0-24", "subnet-b", nodeB)
	allowed(t, "admin creates b's claim", adm.Create(ctx, theirs))
	allowed(t, "agent reads b's claim", a.Get(ctx, client.ObjectKeyFromObject(theirs), &got))
	got.Spec.HolderIdentity = ptr.To("subnet-a")
	got.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: nodeA.Name, UID: nodeA.UID}}
	refused(t, "agent takes over b's claim", a.Update(ctx, &got), want)
}
