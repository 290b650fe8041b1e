package node

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/rules"
)

// The Node annotations of guest networking across nodes. They are the
// agent's (it writes them on its own Node), read by the other agents; they
// live here, not in api/v1alpha1, because nothing but the agents reads them.
const (
	// AnnotationGuestCIDR is the node's guest subnet, claimed from
	// --cluster-guest-cidr.
	AnnotationGuestCIDR = "kairon.zyvor.dev/guest-cidr"
	// AnnotationCrossNodeAddress is where the other nodes send traffic for
	// this node's guests (--cross-node-address, else its InternalIP).
	AnnotationCrossNodeAddress = "kairon.zyvor.dev/cross-node-address"
	// LabelGuestSubnetClaim marks the Leases that claim guest subnets.
	LabelGuestSubnetClaim = "kairon.zyvor.dev/guest-subnet"
)

// claimGuestSubnet gives the node its guest subnet of the cluster range:
// the one it holds already, or the lowest free one.
//
// A subnet is held by a Lease in kube-node-lease named after the subnet
// (network.SubnetClaimName), holder the node, owned by the Node object.
// Creating an object is atomic on the API server, so of two nodes racing
// for a subnet exactly one gets it, and the other takes the next. The
// Lease is never renewed or released by an agent: the Kubernetes garbage
// collector deletes it with the Node, and only then can another node have
// the subnet. The Node's annotation guest-cidr records the subnet for the
// other agents.
//
// A registering agent creates its Node first if it does not exist yet: the
// claim needs the Node's UID.
func (a *Agent) claimGuestSubnet(ctx context.Context, cfg *rest.Config, subnets network.GuestSubnets) (netip.Prefix, error) {
	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		return netip.Prefix{}, err
	}
	node := &corev1.Node{}
	err = c.Get(ctx, client.ObjectKey{Name: a.opts.NodeName}, node)
	if apierrors.IsNotFound(err) && a.opts.Register {
		node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.opts.NodeName, Labels: a.nodeLabels()}}
		err = c.Create(ctx, node)
	}
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("guest subnet: reading node %s: %w", a.opts.NodeName, err)
	}
	claim := func(subnet netip.Prefix) (bool, error) {
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: rules.NodeLeaseNamespace, Name: network.SubnetClaimName(subnet),
				Labels:          map[string]string{LabelGuestSubnetClaim: "true"},
				Annotations:     map[string]string{AnnotationGuestCIDR: subnet.String()},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
			},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node.Name), AcquireTime: &metav1.MicroTime{Time: time.Now()}},
		}
		err := c.Create(ctx, lease)
		if err == nil {
			return true, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return false, fmt.Errorf("guest subnet: claiming %s: %w", subnet, err)
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(lease), lease); err != nil {
			if apierrors.IsNotFound(err) {
				return false, nil // freed meanwhile; the next run may take it
			}
			return false, fmt.Errorf("guest subnet: reading the claim of %s: %w", subnet, err)
		}
		return heldBy(lease, node), nil
	}
	var subnet netip.Prefix
	// The subnet on the Node first: a restarted agent keeps it.
	if recorded, err := netip.ParsePrefix(node.Annotations[AnnotationGuestCIDR]); err == nil && subnets.Valid(recorded) {
		ok, err := claim(recorded)
		if err != nil {
			return netip.Prefix{}, err
		}
		if ok {
			subnet = recorded
		}
	}
	if !subnet.IsValid() {
		for candidate := range subnets.Candidates {
			ok, err := claim(candidate)
			if err != nil {
				return netip.Prefix{}, err
			}
			if ok {
				subnet = candidate
				break
			}
		}
	}
	if !subnet.IsValid() {
		return netip.Prefix{}, fmt.Errorf("guest subnet: every /%d of --cluster-guest-cidr %s is taken", subnets.Bits, subnets.Cluster)
	}
	base := node.DeepCopy()
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[AnnotationGuestCIDR] = subnet.String()
	delete(node.Annotations, AnnotationCrossNodeAddress)
	if addr := a.opts.Network.CrossNodeAddress; addr.IsValid() {
		node.Annotations[AnnotationCrossNodeAddress] = addr.String()
	}
	if !equality.Semantic.DeepEqual(base.Annotations, node.Annotations) {
		if err := c.Patch(ctx, node, client.MergeFrom(base)); err != nil {
			return netip.Prefix{}, fmt.Errorf("guest subnet: recording %s on node %s: %w", subnet, node.Name, err)
		}
	}
	return subnet, nil
}

// claimGuestNetwork, with a cluster guest range, claims the node's subnet
// and makes the node network the whole range with that subnet as its pool.
// Without one it changes nothing (each node its own --network-cidr, or a
// shared bridge with --address-pool).
func (a *Agent) claimGuestNetwork(cfg *rest.Config) error {
	n := a.opts.Network
	if n == nil || !n.ClusterCIDR.IsValid() {
		return nil
	}
	subnets, err := network.NewGuestSubnets(n.ClusterCIDR, n.NodePrefix)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subnet, err := a.claimGuestSubnet(ctx, cfg, subnets)
	if err != nil {
		return err
	}
	claimed := *n
	claimed.CIDR, claimed.Pool = subnets.Cluster, subnet
	a.opts.Network = &claimed
	a.crossNode = &crossNode{subnets: subnets, subnet: subnet}
	return nil
}

// heldBy tells whether a subnet claim is node's: its holder, and owned by
// this very Node object (not one of the same name deleted before).
func heldBy(lease *coordinationv1.Lease, node *corev1.Node) bool {
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != node.Name {
		return false
	}
	for _, ref := range lease.OwnerReferences {
		if ref.Kind == "Node" && ref.UID == node.UID {
			return true
		}
	}
	return false
}
