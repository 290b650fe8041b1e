package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node/egress"
	"github.com/zyvor/kairon/internal/node/network"
)

// EgressEnforcer is what the agent needs of egress.Enforcer: confine a
// Machine to a policy (nil: lift it) and forget a tap.
type EgressEnforcer interface {
	Apply(m egress.Machine, p *egress.Policy) error
	Remove(tap string) error
}

// simEnforcer stands in for nftables under the sim backend, whose Machines
// have no network interface: there is no packet to filter, and the agent
// still reports the policies, so that claims bind as with a real backend.
type simEnforcer struct{}

func (simEnforcer) Apply(egress.Machine, *egress.Policy) error { return nil }
func (simEnforcer) Remove(string) error                        { return nil }

// setupEgressController reconciles one namespace at a time: the node's
// Machines in it against the MachineNetworkPolicies in it, because a
// policy's status entry lists every Machine of this node it confines.
func (a *Agent) setupEgressController() error {
	toNamespace := func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetNamespace()}}}
	}
	return ctrl.NewControllerManagedBy(a.mgr).
		Named("node-egress").
		WithOptions(controller.Options{SkipNameValidation: ptr.To(true)}).
		Watches(&kaironv1.MachineNetworkPolicy{}, handler.EnqueueRequestsFromMapFunc(toNamespace)).
		Watches(&kaironv1.Machine{}, handler.EnqueueRequestsFromMapFunc(toNamespace)).
		Complete(reconcile.Func(a.reconcileEgress))
}

// selects tells whether policy p confines Machine m.
func selects(p *kaironv1.MachineNetworkPolicy, m *kaironv1.Machine) bool {
	return selectsWith(p, policySelector(p), m)
}

// policySelector is p's Machine selector, parsed; nil when p names its
// Machine or selects none (a selector that does not parse selects none).
func policySelector(p *kaironv1.MachineNetworkPolicy) labels.Selector {
	if p.Spec.MachineName != "" || p.Spec.MachineSelector == nil {
		return nil
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.MachineSelector)
	if err != nil {
		return nil
	}
	return sel
}

// selectsWith is selects with p's selector parsed once by the caller.
func selectsWith(p *kaironv1.MachineNetworkPolicy, sel labels.Selector, m *kaironv1.Machine) bool {
	if p.Namespace != m.Namespace {
		return false
	}
	if p.Spec.MachineName != "" {
		return p.Spec.MachineName == m.Name
	}
	return sel != nil && sel.Matches(labels.Set(m.Labels))
}

// egressTarget is where a Machine's rules go: its tap and address on this
// node, once it has them.
func (a *Agent) egressTarget(m *kaironv1.Machine) (egress.Machine, bool) {
	if a.ipam == nil || m.DeletionTimestamp != nil || m.Spec.NodeName != a.opts.NodeName {
		return egress.Machine{}, false
	}
	id := instanceID(m.Namespace, m.Name)
	address, ok := a.ipam.Lookup(id)
	if !ok {
		return egress.Machine{}, false // not attached (yet)
	}
	return egress.Machine{Namespace: m.Namespace, Name: m.Name, Tap: network.TapName(a.opts.NodeName, id), IP: address}, true
}

func (a *Agent) reconcileEgress(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	namespace := req.Name
	logger := log.FromContext(ctx).WithValues("namespace", namespace)
	// Read-only views of the cache: this runs on every change of any of
	// the node's Machines, and copying them all each time was the agent's
	// largest cost while a pool refilled during binds.
	var policies kaironv1.MachineNetworkPolicyList
	if err := a.client.List(ctx, &policies, client.InNamespace(namespace), client.UnsafeDisableDeepCopy); err != nil {
		return reconcile.Result{}, err
	}
	var machines kaironv1.MachineList
	if err := a.client.List(ctx, &machines, client.InNamespace(namespace), client.UnsafeDisableDeepCopy); err != nil {
		return reconcile.Result{}, err
	}
	selectors := make([]labels.Selector, len(policies.Items))
	for j := range policies.Items {
		selectors[j] = policySelector(&policies.Items[j])
	}
	a.egressReported.keepOnly(namespace, policies.Items)
	enforced := map[string][]string{} // policy name → Machines
	failed := map[string][]string{}
	var retry error
	for i := range machines.Items {
		m := &machines.Items[i]
		target, ok := a.egressTarget(m)
		if !ok {
			continue
		}
		var selected []egress.NamedPolicy
		var names []string
		for j := range policies.Items {
			if p := &policies.Items[j]; selectsWith(p, selectors[j], m) {
				selected = append(selected, egress.NamedPolicy{Name: p.Name, Egress: p.Spec.Egress})
				names = append(names, p.Name)
			}
		}
		compiled, err := egress.Compile(selected)
		if err != nil {
			// Closed, not open: a policy the agent cannot read confines the
			// Machine to nothing.
			logger.Error(err, "confining the machine to nothing", "machine", m.Name)
			for _, n := range names {
				failed[n] = append(failed[n], fmt.Sprintf("%s: %v", m.Name, err))
			}
			compiled = &egress.Policy{}
		}
		if err := a.egress.Apply(target, compiled); err != nil {
			retry = err
			for _, n := range names {
				failed[n] = append(failed[n], fmt.Sprintf("%s: %v", m.Name, err))
			}
			continue
		}
		for _, n := range names {
			enforced[n] = append(enforced[n], m.Name)
		}
	}
	for i := range policies.Items {
		p := &policies.Items[i]
		if err := a.reportEgress(ctx, p, enforced[p.Name], failed[p.Name]); err != nil {
			retry = err
		}
	}
	return reconcile.Result{}, retry
}

// reportEgress writes this node's entry of the policy's status.nodes with
// server-side apply under a field manager of its own, so that the agents of
// several nodes never overwrite each other's entries. A node with nothing
// to report removes its entry.
func (a *Agent) reportEgress(ctx context.Context, p *kaironv1.MachineNetworkPolicy, machines, errs []string) error {
	sort.Strings(machines)
	sort.Strings(errs)
	var current *kaironv1.PolicyEnforcement
	for i := range p.Status.Nodes {
		if p.Status.Nodes[i].Node == a.opts.NodeName {
			current = &p.Status.Nodes[i]
		}
	}
	want := kaironv1.PolicyEnforcement{Node: a.opts.NodeName, Machines: machines, ObservedGeneration: p.Generation, Error: strings.Join(errs, "; ")}
	none := len(machines) == 0 && len(errs) == 0
	switch {
	case none && current == nil:
		return nil
	case !none && current != nil && sameEnforcement(*current, want):
		return nil
	case a.egressReported.wrote(p.UID, want, none):
		// The cache has yet to show this agent's last write, which
		// already says this: writing it again is a write for nothing on
		// the path of every egress bind.
		return nil
	}
	status := map[string]any{}
	if len(machines) > 0 || len(errs) > 0 {
		status["nodes"] = []kaironv1.PolicyEnforcement{want}
	} else {
		status["nodes"] = []any{}
	}
	body, err := json.Marshal(map[string]any{
		"apiVersion": kaironv1.GroupVersion.String(),
		"kind":       "MachineNetworkPolicy",
		"metadata":   map[string]any{"name": p.Name, "namespace": p.Namespace},
		"status":     status,
	})
	if err != nil {
		return err
	}
	err = a.client.Status().Patch(ctx, p.DeepCopy(), client.RawPatch(types.ApplyPatchType, body),
		client.FieldOwner("kairon-node/"+a.opts.NodeName), client.ForceOwnership)
	if err != nil {
		a.egressReported.forget(p.UID)
		return client.IgnoreNotFound(err)
	}
	a.egressReported.record(p, want, none)
	return nil
}

func sameEnforcement(a, b kaironv1.PolicyEnforcement) bool {
	return slices.Equal(a.Machines, b.Machines) && a.ObservedGeneration == b.ObservedGeneration && a.Error == b.Error
}

// egressReports remembers this agent's last status.nodes entry per policy.
type egressReports struct {
	mu      sync.Mutex
	entries map[types.UID]egressReport
}

type egressReport struct {
	namespace string
	entry     kaironv1.PolicyEnforcement
	none      bool // the entry was removed
}

func (r *egressReports) wrote(uid types.UID, want kaironv1.PolicyEnforcement, none bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	last, ok := r.entries[uid]
	return ok && last.none == none && (none || sameEnforcement(last.entry, want))
}

func (r *egressReports) record(p *kaironv1.MachineNetworkPolicy, entry kaironv1.PolicyEnforcement, none bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.entries == nil {
		r.entries = map[types.UID]egressReport{}
	}
	r.entries[p.UID] = egressReport{namespace: p.Namespace, entry: entry, none: none}
}

func (r *egressReports) forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.entries, uid)
}

// keepOnly forgets the policies of namespace that no longer exist.
func (r *egressReports) keepOnly(namespace string, policies []kaironv1.MachineNetworkPolicy) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, e := range r.entries {
		if e.namespace == namespace && !slices.ContainsFunc(policies, func(p kaironv1.MachineNetworkPolicy) bool { return p.UID == uid }) {
			delete(r.entries, uid)
		}
	}
}

// removeEgress lifts a Machine's confinement as its tap goes.
func (a *Agent) removeEgress(id string) error {
	if a.egress == nil {
		return nil
	}
	return a.egress.Remove(network.TapName(a.opts.NodeName, id))
}

// setupEgress prepares enforcement on the node network: the nftables
// tables, before any tap as the baseline, and the DNS proxy.
func (a *Agent) setupEgress() error {
	n := a.opts.Network
	e := &egress.Enforcer{NetNS: n.NetNS, Bridge: n.Bridge, Network: n.CIDR, Gateway: a.ipam.Gateway().Addr()}
	eo := a.opts.Egress
	if eo != nil && eo.Masquerade != "" {
		e.Masquerade = eo.Masquerade
		if e.Masquerade == "auto" {
			// A namespace without a default route has no uplink: guests
			// reach what the node routes to, without NAT.
			e.Masquerade, _ = egress.DefaultRouteInterface(n.NetNS)
		}
	}
	// Guests reach the outside through the node: it routes for them.
	if err := egress.EnableForwarding(n.NetNS); err != nil {
		return err
	}
	if eo != nil && eo.DNSPort != 0 {
		if eo.DNSUpstream == "" {
			return errors.New("--egress-dns-upstream is required with --egress-dns-port")
		}
		e.DNSPort = eo.DNSPort
		// Forwarded from the bridge's namespace, as the guests' own
		// queries would leave.
		a.dnsProxy = &egress.DNSProxy{Enforcer: e, Upstream: eo.DNSUpstream, Dial: egress.DialIn(n.NetNS)}
	}
	if eo != nil && eo.SNIPort != 0 {
		e.SNIPort = eo.SNIPort
		a.sniProxy = &egress.SNIProxy{Enforcer: e, Dial: egress.DialIn(n.NetNS)}
	}
	if err := e.Setup(); err != nil {
		return fmt.Errorf("node network: %w", err)
	}
	a.egress = e
	return nil
}

// serveEgressSNI runs the SNI proxy in the bridge's namespace.
func (a *Agent) serveEgressSNI(ctx context.Context) error {
	ln, err := egress.ListenTCP(a.opts.Network.NetNS, a.proxyAddress(a.opts.Egress.SNIPort))
	if err != nil {
		return err
	}
	logger := log.FromContext(ctx).WithName("egress-sni")
	a.sniProxy.Denied = func(m egress.Machine, dst netip.AddrPort, name string) {
		what := fmt.Sprintf("reset a TCP connection to %s that did not open with a TLS ClientHello naming an allowed server", dst)
		if name != "" {
			what = fmt.Sprintf("reset a TLS connection to %s naming server %q", dst, name)
		}
		logger.V(1).Info("reset a connection", "machine", m.Namespace+"/"+m.Name, "destination", dst.String(), "serverName", name)
		a.deniedInAgent(ctx, m, egress.ReasonSNI, what)
	}
	return a.sniProxy.Serve(ctx, ln)
}

// proxyAddress is where a proxy listens: the bridge's address, where the
// nat chains redirect guests' traffic, and nowhere else (a DNS forwarder
// on the node's uplink would serve anyone who reaches it).
func (a *Agent) proxyAddress(port uint16) string {
	return netip.AddrPortFrom(a.ipam.Gateway().Addr(), port).String()
}

// serveEgressDNS runs the DNS proxy in the bridge's namespace.
func (a *Agent) serveEgressDNS(ctx context.Context) error {
	uc, ln, err := egress.Listen(a.opts.Network.NetNS, a.proxyAddress(a.opts.Egress.DNSPort))
	if err != nil {
		return err
	}
	logger := log.FromContext(ctx).WithName("egress-dns")
	a.dnsProxy.Denied = func(m egress.Machine, name string) {
		logger.V(1).Info("refused a DNS query", "machine", m.Namespace+"/"+m.Name, "name", name)
		a.deniedInAgent(ctx, m, egress.ReasonDNS, fmt.Sprintf("refused the DNS query for %q", name))
	}
	return a.dnsProxy.Serve(ctx, uc, ln)
}

// keepEgress writes the egress rules again when something flushed them,
// every interval, as the baseline does.
func (a *Agent) keepEgress(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("egress")
	return a.egress.(*egress.Enforcer).Keep(ctx, a.opts.Interval, func(err error, msg string) {
		if err != nil {
			logger.Error(err, msg)
		} else {
			logger.Info(msg)
		}
	})
}

// confineBeforeStart applies the policies selecting machine to its new tap
// before its VM starts (or arrives by migration, before this node owns the
// Machine), so that the guest never runs here unconfined. The egress
// reconciler takes over once the Machine is this node's.
func (a *Agent) confineBeforeStart(machine *kaironv1.Machine, id string, address netip.Addr) error {
	if a.egress == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var policies kaironv1.MachineNetworkPolicyList
	if err := a.client.List(ctx, &policies, client.InNamespace(machine.Namespace)); err != nil {
		return fmt.Errorf("reading the Machine's egress policies: %w", err)
	}
	var selected []egress.NamedPolicy
	for i := range policies.Items {
		if p := &policies.Items[i]; selects(p, machine) {
			selected = append(selected, egress.NamedPolicy{Name: p.Name, Egress: p.Spec.Egress})
		}
	}
	compiled, err := egress.Compile(selected)
	if err != nil {
		compiled = &egress.Policy{} // closed, as the reconciler does
	}
	target := egress.Machine{Namespace: machine.Namespace, Name: machine.Name, Tap: network.TapName(a.opts.NodeName, id), IP: address}
	if err := a.egress.Apply(target, compiled); err != nil {
		return fmt.Errorf("egress policy: %w", err)
	}
	return nil
}
