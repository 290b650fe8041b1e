package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/requeue"
)

// A guest address is the Machine's, cluster-wide: no two Machines may ever
// hold one (issue 42). The nodes' pools are disjoint, but a guest keeps its
// address when it moves (migration, recovery after fencing), so a node's
// own file of allocations cannot tell which of its pool's addresses are
// free: the Machines of the whole cluster can. guestAddresses is the
// agent's view of them, kept by one controller over a cache of every
// Machine. It serves the IPAM (no address another Machine reports is
// handed out, none before the first look), the start of a VM (refused
// while another Machine holds its address), the release of an address a
// departed guest may still have (held until the cluster shows it free),
// and the namespaces' address sets of the guest baseline.
//
// The view exists wherever guests have a network: a node with links
// (kairon-local's shared bridge, a real node) or a cluster guest range.
// Sim nodes without links give nominal addresses that reach no wire; they
// skip it, so that hundreds of hollow nodes do not each watch every
// Machine.
type guestAddresses struct {
	// network is the range whose addresses count: the node network, or
	// the cluster guest range with cross-node routing.
	network  netip.Prefix
	machines cache.Cache

	mu sync.Mutex
	// inUse is, from the last sync, the instance IDs of the Machines that
	// report each guest address; nil until the first sync.
	inUse map[netip.Addr][]string
	// looked is closed by the first sync.
	looked     chan struct{}
	lookedOnce sync.Once
}

// firstLookWait bounds how long a VM that must start now (a migration's
// target, a restore) waits for the agent's first look at the cluster.
const firstLookWait = 30 * time.Second

// addressInUseError refuses a VM whose address another Machine holds.
type addressInUseError struct {
	address netip.Addr
	holders []string // instance IDs
}

func (e addressInUseError) Error() string {
	names := make([]string, len(e.holders))
	for i, id := range e.holders {
		names[i] = strings.Replace(id, "_", "/", 1)
	}
	return fmt.Sprintf("guest address %s is held by Machine %s: the VM does not start with an address another Machine has", e.address, strings.Join(names, ", "))
}

// ready tells the IPAM whether the view can be trusted: not before the
// first sync (a start that comes earlier fails transiently and is retried).
func (g *guestAddresses) ready() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inUse == nil {
		return errors.New("the guest addresses of the cluster are not known yet (the agent's first look at every Machine is pending): no new address until then")
	}
	return nil
}

// holdersBesides lists the Machines other than id that report addr.
func (g *guestAddresses) holdersBesides(id string, addr netip.Addr) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var others []string
	for _, holder := range g.inUse[addr] {
		if holder != id {
			others = append(others, holder)
		}
	}
	return others
}

// taken tells whether addr belongs to a Machine other than id (the IPAM's
// Taken).
func (g *guestAddresses) taken(id string, addr netip.Addr) bool {
	return len(g.holdersBesides(id, addr)) > 0
}

// holds tells whether the Machine id reports addr.
func (g *guestAddresses) holds(id string, addr netip.Addr) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Contains(g.inUse[addr], id)
}

// checkFree refuses addr for id when another Machine holds it. Just after
// the agent started it first waits, up to firstLookWait, for the first
// look at the cluster, and refuses any address (transiently) without it.
func (g *guestAddresses) checkFree(id string, addr netip.Addr) error {
	if g.ready() != nil && g.looked != nil {
		select {
		case <-g.looked:
		case <-time.After(firstLookWait):
		}
	}
	if err := g.ready(); err != nil {
		return transient(err)
	}
	if holders := g.holdersBesides(id, addr); len(holders) > 0 {
		return addressInUseError{address: addr, holders: holders}
	}
	return nil
}

// guestAddressesOf reads, from every Machine of the cluster, who reports
// each address of network and each namespace's addresses.
func guestAddressesOf(network netip.Prefix, machines []kaironv1.Machine) (inUse map[netip.Addr][]string, byNamespace map[string][]netip.Addr) {
	inUse, byNamespace = map[netip.Addr][]string{}, map[string][]netip.Addr{}
	for _, m := range machines {
		for _, address := range m.Status.Addresses {
			addr, err := netip.ParseAddr(address.Address)
			if err != nil || !network.Contains(addr) {
				continue
			}
			id := instanceID(m.Namespace, m.Name)
			if !slices.Contains(inUse[addr], id) {
				inUse[addr] = append(inUse[addr], id)
			}
			byNamespace[m.Namespace] = append(byNamespace[m.Namespace], addr)
		}
	}
	for _, ids := range inUse {
		slices.Sort(ids)
	}
	return inUse, byNamespace
}

// setupGuestAddresses starts the view where guests have a network and
// makes the IPAM consult it.
func (a *Agent) setupGuestAddresses() {
	if a.ipam == nil || (a.links == nil && a.crossNode == nil) {
		return
	}
	a.addresses = &guestAddresses{network: a.opts.Network.CIDR.Masked(), looked: make(chan struct{})}
	a.ipam.Taken, a.ipam.Ready = a.addresses.taken, a.addresses.ready
}

// setupGuestAddressController keeps the view in step with the cluster's
// Machines: one sync of the whole view whenever one changes, and every
// interval.
func (a *Agent) setupGuestAddressController(cfg *rest.Config, scheme *runtime.Scheme) error {
	if a.addresses == nil {
		return nil
	}
	machines, err := cache.New(cfg, cache.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	a.addresses.machines = machines
	if err := a.mgr.Add(machines); err != nil {
		return err
	}
	everything := reconcile.Request{NamespacedName: client.ObjectKey{Name: "guest-addresses"}}
	return ctrl.NewControllerManagedBy(a.mgr).
		Named("node-guest-addresses").
		WithOptions(controller.Options{SkipNameValidation: ptr.To(true), MaxConcurrentReconciles: 1}).
		WatchesRawSource(source.Kind(machines, &kaironv1.Machine{},
			handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, *kaironv1.Machine) []reconcile.Request { return []reconcile.Request{everything} }))).
		Complete(requeue.UntilStopped(reconcile.Func(a.syncGuestAddresses)))
}

// syncGuestAddresses applies the cluster's guest addresses: the view, the
// release of held addresses no Machine reports any more, and the
// namespaces' address sets of the baseline.
func (a *Agent) syncGuestAddresses(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var machines kaironv1.MachineList
	if err := a.addresses.machines.List(ctx, &machines); err != nil {
		return reconcile.Result{}, err
	}
	inUse, byNamespace := guestAddressesOf(a.addresses.network, machines.Items)
	a.addresses.mu.Lock()
	a.addresses.inUse = inUse
	a.addresses.mu.Unlock()
	a.addresses.lookedOnce.Do(func() { close(a.addresses.looked) })
	var errs []error
	freed, err := a.ipam.ReleaseUnheld(a.addresses.holds)
	errs = append(errs, err)
	if len(freed) > 0 {
		log.FromContext(ctx).Info("released the addresses of departed guests no Machine reports any more", "instances", freed)
	}
	if a.baseline != nil {
		errs = append(errs, a.baseline.SetNamespaceAddresses(byNamespace))
	}
	return reconcile.Result{RequeueAfter: a.opts.Interval}, errors.Join(errs...)
}

// releaseAddress gives up id's address as its VM leaves this node. With a
// view of the cluster the address is held until no Machine reports it: a
// guest that moved elsewhere keeps it, and a new VM here must not get it.
func (a *Agent) releaseAddress(id string) error {
	if a.ipam == nil {
		return nil
	}
	if a.addresses == nil {
		return a.ipam.Release(id)
	}
	return a.ipam.Hold(id)
}
