package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules"
)

// crossNode is the agent's part of guest networking across nodes
// (docs/guides/networking.md): its subnet of the cluster range and the
// routes to the other nodes' guests and to the guests away from their
// subnet's node. Every guest address of the cluster is the business of
// guestAddresses (guest_addresses.go), whose cache of every Machine this
// part reads too.
type crossNode struct {
	subnets network.GuestSubnets
	subnet  netip.Prefix
	// routes is nil without links (sim backend) or with routing none.
	routes *network.CrossNode

	// claims caches the subnet claims checked: "node/UID/subnet" of each
	// Node whose guest-cidr annotation its Lease confirmed.
	claims sync.Map
	// nodeOf is the node of every scheduled Machine (by instance ID) at
	// the last sync: a Machine here now that was elsewhere then arrived.
	nodeOf map[string]string

	// applying is held by a sync and by the teardown at stop: the manager
	// stops both at once, and a sync still running while the routes were
	// removed would put one back on a node its agent has left. stopped:
	// the agent stops, and no sync changes anything any more.
	applying sync.Mutex
	stopped  bool
}

// confirmed tells whether node really holds the subnet its annotation
// names: the subnet's Lease is held by this very Node object. An agent
// writes its own Node's annotations; without this check one could draw
// another node's guest traffic to itself by naming that node's subnet.
func (a *Agent) confirmed(ctx context.Context, node *corev1.Node, subnet netip.Prefix) bool {
	key := node.Name + "/" + string(node.UID) + "/" + subnet.String()
	if _, ok := a.crossNode.claims.Load(key); ok {
		return true
	}
	lease := &coordinationv1.Lease{}
	err := a.mgr.GetAPIReader().Get(ctx, client.ObjectKey{Namespace: rules.NodeLeaseNamespace, Name: network.SubnetClaimName(subnet)}, lease)
	if err != nil || !heldBy(lease, node) {
		return false
	}
	a.crossNode.claims.Store(key, true)
	return true
}

// setupCrossNodeRoutes prepares routing to other nodes in the bridge's
// namespace, once the bridge and the baseline exist.
func (a *Agent) setupCrossNodeRoutes() error {
	n := a.opts.Network
	mode := n.CrossNode
	if mode == "" {
		mode = network.CrossNodeNone
	}
	if mode != network.CrossNodeNone && a.crossNode == nil {
		return fmt.Errorf("--cross-node-routing=%s needs --cluster-guest-cidr: the nodes' guest subnets come from it", mode)
	}
	if a.crossNode == nil {
		return nil
	}
	if mode == network.CrossNodeNone || n.NoLinks {
		return nil
	}
	local := n.CrossNodeAddress
	if !local.IsValid() && a.opts.NodeIP != "" {
		local, _ = netip.ParseAddr(a.opts.NodeIP)
	}
	if mode == network.CrossNodeVXLAN && !local.Is4() {
		return errors.New("--cross-node-routing=vxlan needs this node's IPv4 address between nodes: --cross-node-address or --node-ip")
	}
	a.crossNode.routes = &network.CrossNode{NetNS: n.NetNS, Bridge: n.Bridge, Node: a.opts.NodeName, Local: local, Mode: mode,
		VNI: n.VXLANID, Port: n.VXLANPort}
	if err := a.crossNode.routes.Setup(); err != nil {
		return fmt.Errorf("--cross-node-routing=%s: %w", mode, err)
	}
	return nil
}

// setupCrossNodeController keeps the routes in step with the cluster's
// Nodes and Machines: one sync of the whole view whenever either changes,
// and every interval (a route someone removed comes back). It runs after
// setupGuestAddressController, whose cache of every Machine it watches.
func (a *Agent) setupCrossNodeController() error {
	if a.crossNode == nil {
		return nil
	}
	machines := a.addresses.machines
	everything := reconcile.Request{NamespacedName: client.ObjectKey{Name: "cross-node"}}
	err := ctrl.NewControllerManagedBy(a.mgr).
		Named("node-cross-node").
		WithOptions(controller.Options{SkipNameValidation: ptr.To(true), MaxConcurrentReconciles: 1}).
		WatchesRawSource(source.Kind(a.mgr.GetCache(), &corev1.Node{},
			handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, *corev1.Node) []reconcile.Request { return []reconcile.Request{everything} }))).
		WatchesRawSource(source.Kind(machines, &kaironv1.Machine{},
			handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, *kaironv1.Machine) []reconcile.Request { return []reconcile.Request{everything} }))).
		Complete(requeue.UntilStopped(reconcile.Func(a.syncCrossNode)))
	if err != nil {
		return err
	}
	return a.mgr.Add(manager.RunnableFunc(a.removeCrossNodeRoutesAtStop))
}

// crossNodeView is what the cluster says about guest routing: the other
// nodes' subnets and the guests away from their subnet's node.
type crossNodeView struct {
	peers []network.Peer
	moved []network.MovedGuest
}

// buildCrossNodeView reads the view from Nodes and Machines. A Node's
// subnet is its guest-cidr annotation, if it is one of the cluster range's
// and confirmed says the Node holds it; its address the cross-node-address
// annotation, else its InternalIP.
func buildCrossNodeView(subnets network.GuestSubnets, nodes []corev1.Node, machines []kaironv1.Machine,
	confirmed func(*corev1.Node, netip.Prefix) bool) crossNodeView {
	var view crossNodeView
	subnetOf := map[string]netip.Prefix{}
	for i := range nodes {
		node := &nodes[i]
		subnet, err := netip.ParsePrefix(node.Annotations[AnnotationGuestCIDR])
		if err != nil || !subnets.Valid(subnet) || !confirmed(node, subnet) {
			continue
		}
		subnetOf[node.Name] = subnet
		addr, err := netip.ParseAddr(node.Annotations[AnnotationCrossNodeAddress])
		if err != nil {
			for _, a := range node.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					addr, _ = netip.ParseAddr(a.Address)
					break
				}
			}
		}
		if !addr.Is4() {
			continue
		}
		view.peers = append(view.peers, network.Peer{Node: node.Name, Subnet: subnet, Address: addr})
	}
	for _, m := range machines {
		for _, address := range m.Status.Addresses {
			addr, err := netip.ParseAddr(address.Address)
			if err != nil || !subnets.Cluster.Contains(addr) {
				continue
			}
			if subnet, ok := subnetOf[m.Spec.NodeName]; ok && !subnet.Contains(addr) {
				view.moved = append(view.moved, network.MovedGuest{Address: addr, Node: m.Spec.NodeName})
			}
		}
	}
	return view
}

// arrivals compares where the Machines run with where they ran at the
// last look (last, nil before the first): for each Machine that runs on
// node now and ran on another node then, it returns the guest addresses of
// the Machine's namespace on that other node, its former neighbours on
// that node's bridge. It also returns where each Machine runs now.
func arrivals(node string, last map[string]string, machines []kaironv1.Machine, cluster netip.Prefix) ([]netip.Addr, map[string]string) {
	now := make(map[string]string, len(machines))
	from := map[string]map[string]bool{} // namespace → nodes Machines of it arrived from
	for _, m := range machines {
		if m.Spec.NodeName == "" {
			continue
		}
		id := instanceID(m.Namespace, m.Name)
		now[id] = m.Spec.NodeName
		if was, ok := last[id]; ok && was != node && m.Spec.NodeName == node {
			if from[m.Namespace] == nil {
				from[m.Namespace] = map[string]bool{}
			}
			from[m.Namespace][was] = true
		}
	}
	var addrs []netip.Addr
	for _, m := range machines {
		if !from[m.Namespace][m.Spec.NodeName] {
			continue
		}
		for _, a := range m.Status.Addresses {
			if addr, err := netip.ParseAddr(a.Address); err == nil && cluster.Contains(addr) {
				addrs = append(addrs, addr)
			}
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs), now
}

// syncCrossNode applies the current view.
func (a *Agent) syncCrossNode(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	a.crossNode.applying.Lock()
	defer a.crossNode.applying.Unlock()
	if a.crossNode.stopped {
		return reconcile.Result{}, nil
	}
	var nodes corev1.NodeList
	if err := a.client.List(ctx, &nodes); err != nil {
		return reconcile.Result{}, err
	}
	var machines kaironv1.MachineList
	if err := a.addresses.machines.List(ctx, &machines); err != nil {
		return reconcile.Result{}, err
	}
	view := buildCrossNodeView(a.crossNode.subnets, nodes.Items, machines.Items, func(node *corev1.Node, subnet netip.Prefix) bool {
		return node.Name == a.opts.NodeName || a.confirmed(ctx, node, subnet)
	})
	// Only this reconciler, one sync at a time, uses nodeOf.
	var neighbours []netip.Addr
	neighbours, a.crossNode.nodeOf = arrivals(a.opts.NodeName, a.crossNode.nodeOf, machines.Items, a.crossNode.subnets.Cluster)
	var errs []error
	if r := a.crossNode.routes; r != nil {
		errs = append(errs, r.Sync(view.peers, view.moved))
		// After the routes: the announced addresses must be routed away.
		errs = append(errs, r.AnnounceElsewhere(neighbours))
	}
	return reconcile.Result{RequeueAfter: a.opts.Interval}, errors.Join(errs...)
}

// removeCrossNodeRoutesAtStop removes the routes and the VXLAN device when
// the agent stops, unless it leaves VMs running: their guests keep reaching
// the other nodes until the next agent takes over, as they keep their taps.
func (a *Agent) removeCrossNodeRoutesAtStop(ctx context.Context) error {
	<-ctx.Done()
	a.crossNode.applying.Lock()
	defer a.crossNode.applying.Unlock()
	a.crossNode.stopped = true
	r := a.crossNode.routes
	if r == nil {
		return nil
	}
	logger := log.FromContext(ctx).WithName("cross-node")
	instances, err := a.opts.Backend.List(context.WithoutCancel(ctx))
	if err != nil {
		logger.Error(err, "listing VMs; the routes to other nodes stay")
		return nil
	}
	for _, inst := range instances {
		if inst.Phase != backend.Exited {
			logger.Info("VMs keep running: the routes to other nodes stay for them")
			return nil
		}
	}
	if err := r.Teardown(); err != nil {
		logger.Error(err, "removing the routes to other nodes")
	}
	return nil
}
