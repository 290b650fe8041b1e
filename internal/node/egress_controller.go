package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node/egress"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules/egresspolicy"
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

// egressKey is one item of the egress controller's queue: a Machine of
// this node, whose rules it brings to the policies that select it, or a
// policy, whose status entry of this node it writes.
type egressKey struct {
	types.NamespacedName
	policy bool
}

// egressWorkers lets a policy's status write go while another Machine's
// rules are applied (nftables transactions themselves go one at a time).
// A key is never reconciled by two workers at once.
const egressWorkers = 4

// egressPolicyMachineIndex indexes MachineNetworkPolicies by the Machine
// they name, or by selectorPolicies when they select by labels.
const (
	egressPolicyMachineIndex = "kairon.node.egressMachine"
	selectorPolicies         = "*" // never a Machine's name
)

func policyIndexValue(o client.Object) []string {
	p := o.(*kaironv1.MachineNetworkPolicy)
	switch {
	case p.Spec.MachineName != "":
		return []string{p.Spec.MachineName}
	case p.Spec.MachineSelector != nil:
		return []string{selectorPolicies}
	}
	return nil
}

// setupEgressController reconciles each Machine and each policy on its
// own: a change costs what it touches, however many Machines and policies
// share the namespace (egress_applied.go says how a policy's entry stays
// whole).
func (a *Agent) setupEgressController() error {
	if err := a.mgr.GetFieldIndexer().IndexField(context.Background(), &kaironv1.MachineNetworkPolicy{}, egressPolicyMachineIndex, policyIndexValue); err != nil {
		return err
	}
	c, err := controller.NewTyped[egressKey]("node-egress", a.mgr, controller.TypedOptions[egressKey]{
		SkipNameValidation:      ptr.To(true),
		MaxConcurrentReconciles: egressWorkers,
		Reconciler:              requeue.UntilStoppedTyped[egressKey](reconcile.TypedFunc[egressKey](a.reconcileEgress)),
		NewQueue: func(name string, limiter workqueue.TypedRateLimiter[egressKey]) workqueue.TypedRateLimitingInterface[egressKey] {
			// In arrival order, as every queue of the agent's
			// (requeue.ControllerConfig says why); kept for the
			// reconciles that queue the entries of the policies they
			// touched.
			q := workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[egressKey]{Name: name})
			a.egressQueue.Store(&q)
			return q
		},
	})
	if err != nil {
		return err
	}
	cache := a.mgr.GetCache()
	if err := c.Watch(source.TypedKind(cache, &kaironv1.Machine{}, handler.TypedFuncs[*kaironv1.Machine, egressKey]{
		CreateFunc: func(_ context.Context, e event.TypedCreateEvent[*kaironv1.Machine], q workqueue.TypedRateLimitingInterface[egressKey]) {
			q.Add(egressMachineKey(e.Object))
		},
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[*kaironv1.Machine], q workqueue.TypedRateLimitingInterface[egressKey]) {
			q.Add(egressMachineKey(e.ObjectNew))
		},
		DeleteFunc: func(_ context.Context, e event.TypedDeleteEvent[*kaironv1.Machine], q workqueue.TypedRateLimitingInterface[egressKey]) {
			q.Add(egressMachineKey(e.Object))
		},
	})); err != nil {
		return err
	}
	return c.Watch(source.TypedKind(cache, &kaironv1.MachineNetworkPolicy{}, handler.TypedFuncs[*kaironv1.MachineNetworkPolicy, egressKey]{
		CreateFunc: func(ctx context.Context, e event.TypedCreateEvent[*kaironv1.MachineNetworkPolicy], q workqueue.TypedRateLimitingInterface[egressKey]) {
			a.policyChanged(ctx, q, e.Object)
		},
		UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[*kaironv1.MachineNetworkPolicy], q workqueue.TypedRateLimitingInterface[egressKey]) {
			if e.ObjectOld.Generation != e.ObjectNew.Generation || e.ObjectOld.UID != e.ObjectNew.UID {
				a.policyChanged(ctx, q, e.ObjectOld)
				a.policyChanged(ctx, q, e.ObjectNew)
				return
			}
			// Status only (this node's report, or another node's): the
			// entry is checked again, in case it was overwritten.
			q.Add(egressPolicyKey(e.ObjectNew))
		},
		DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[*kaironv1.MachineNetworkPolicy], q workqueue.TypedRateLimitingInterface[egressKey]) {
			a.policyChanged(ctx, q, e.Object)
		},
	}))
}

func egressMachineKey(m client.Object) egressKey {
	return egressKey{NamespacedName: client.ObjectKeyFromObject(m)}
}

func egressPolicyKey(p client.Object) egressKey {
	return egressKey{NamespacedName: client.ObjectKeyFromObject(p), policy: true}
}

// policyChanged queues what a policy's creation, deletion or new
// generation touches: its entry, the Machines it selects and those whose
// rules hold it.
func (a *Agent) policyChanged(ctx context.Context, q workqueue.TypedRateLimitingInterface[egressKey], p *kaironv1.MachineNetworkPolicy) {
	q.Add(egressPolicyKey(p))
	for _, name := range a.egressApplied.policyChanged(client.ObjectKeyFromObject(p)) {
		q.Add(egressKey{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: name}})
	}
	for _, m := range a.machinesOf(ctx, p) {
		q.Add(egressMachineKey(m))
	}
}

// queueEgress adds keys to the egress controller's queue from a reconcile.
func (a *Agent) queueEgress(keys ...egressKey) {
	q := a.egressQueue.Load()
	if q == nil {
		return
	}
	for _, k := range keys {
		(*q).Add(k)
	}
}

func (a *Agent) reconcileEgress(ctx context.Context, key egressKey) (reconcile.Result, error) {
	if key.policy {
		return reconcile.Result{}, a.reconcilePolicyReport(ctx, key.NamespacedName)
	}
	return reconcile.Result{}, a.reconcileMachineEgress(ctx, key.NamespacedName)
}

// reconcileMachineEgress confines one Machine to the union of the policies
// that select it now, records that (egressApplied) and queues the entries
// of the policies it gained or lost.
func (a *Agent) reconcileMachineEgress(ctx context.Context, key types.NamespacedName) error {
	epoch := a.egressApplied.epoch(key.Namespace)
	m := &kaironv1.Machine{}
	if err := a.client.Get(ctx, key, m); err != nil {
		if !apierrors.IsNotFound(err) {
			return err
		}
		m = nil
	}
	target, ok := egress.Machine{}, false
	if m != nil {
		target, ok = a.egressTarget(m)
	}
	if !ok {
		// Gone, or not attached here: the tap's teardown lifts the rules
		// (removeEgress); the entries stop listing it now.
		a.queuePolicyReports(key.Namespace, a.egressApplied.drop(key))
		return nil
	}
	policies, err := a.policiesSelecting(ctx, m)
	if err != nil {
		return err
	}
	rec := appliedEgress{policies: make([]appliedPolicy, len(policies))}
	for i, p := range policies {
		rec.policies[i] = appliedPolicyOf(p)
	}
	slices.SortFunc(rec.policies, func(x, y appliedPolicy) int { return strings.Compare(x.name, y.name) })
	compiled, err := compilePolicies(policies)
	if err != nil {
		// Closed, not open: a policy the agent cannot read confines the
		// Machine to nothing.
		log.FromContext(ctx).Error(err, "confining the machine to nothing", "machine", key.String())
		rec.err = err.Error()
		compiled = &egress.Policy{}
	}
	began := time.Now()
	applyErr := a.egress.Apply(target, compiled)
	observeSince(egressApplyDuration, a.opts.NodeName, began)
	if applyErr != nil {
		rec.err = applyErr.Error()
	}
	changed, stale := a.egressApplied.set(key, rec, epoch)
	a.queuePolicyReports(key.Namespace, changed)
	if stale {
		// A policy changed while this ran: what was read may be older
		// than what the policy's handler saw in this Machine's record.
		a.queueEgress(egressKey{NamespacedName: key})
	}
	return applyErr
}

func (a *Agent) queuePolicyReports(namespace string, names []string) {
	for _, name := range names {
		a.queueEgress(egressKey{NamespacedName: types.NamespacedName{Namespace: namespace, Name: name}, policy: true})
	}
}

// policiesSelecting lists, from the cache, the policies that confine m:
// those naming it and those whose selector matches its labels.
func (a *Agent) policiesSelecting(ctx context.Context, m *kaironv1.Machine) ([]*kaironv1.MachineNetworkPolicy, error) {
	var out []*kaironv1.MachineNetworkPolicy
	for _, value := range []string{m.Name, selectorPolicies} {
		var list kaironv1.MachineNetworkPolicyList
		// Read only (compiled, never written): no copies on the path of
		// every Machine event.
		if err := a.client.List(ctx, &list, client.InNamespace(m.Namespace), client.MatchingFields{egressPolicyMachineIndex: value}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("reading the Machine's egress policies: %w", err)
		}
		for i := range list.Items {
			if p := &list.Items[i]; selects(p, m) {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// compilePolicies is the union of policies, for the enforcer.
func compilePolicies(policies []*kaironv1.MachineNetworkPolicy) (*egress.Policy, error) {
	named := make([]egresspolicy.NamedPolicy, len(policies))
	for i, p := range policies {
		named[i] = egresspolicy.NamedPolicy{Name: p.Name, Egress: p.Spec.Egress}
	}
	return egresspolicy.Compile(named)
}

// machinesOf returns the Machines of this node that p selects, from the
// cache (read-only).
func (a *Agent) machinesOf(ctx context.Context, p *kaironv1.MachineNetworkPolicy) []*kaironv1.Machine {
	if p.Spec.MachineName != "" {
		m := &kaironv1.Machine{}
		if err := a.client.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.MachineName}, m); err != nil {
			return nil // not this node's (the cache holds only those)
		}
		return []*kaironv1.Machine{m}
	}
	sel := policySelector(p)
	if sel == nil {
		return nil
	}
	var list kaironv1.MachineList
	if err := a.client.List(ctx, &list, client.InNamespace(p.Namespace), client.MatchingLabelsSelector{Selector: sel}, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "listing the Machines a policy selects", "policy", client.ObjectKeyFromObject(p).String())
		return nil
	}
	// The list is already what p selects: same namespace, same selector.
	out := make([]*kaironv1.Machine, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out
}

// selects tells whether policy p confines Machine m.
func selects(p *kaironv1.MachineNetworkPolicy, m *kaironv1.Machine) bool {
	if p.Namespace != m.Namespace {
		return false
	}
	if p.Spec.MachineName != "" {
		return p.Spec.MachineName == m.Name
	}
	sel := policySelector(p)
	return sel != nil && sel.Matches(labels.Set(m.Labels))
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
	return egress.Machine{Namespace: m.Namespace, Name: m.Name, Tap: network.TapName(a.opts.NodeName, id), MAC: network.MAC(id), IP: address}, true
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
	if eo != nil {
		e.MinTTL = eo.DNSMinTTL
	}
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
	policies, err := a.policiesSelecting(ctx, machine)
	if err != nil {
		return err
	}
	compiled, err := compilePolicies(policies)
	if err != nil {
		compiled = &egress.Policy{} // closed, as the reconciler does
	}
	target := egress.Machine{Namespace: machine.Namespace, Name: machine.Name, Tap: network.TapName(a.opts.NodeName, id), MAC: network.MAC(id), IP: address}
	if err := a.egress.Apply(target, compiled); err != nil {
		return fmt.Errorf("egress policy: %w", err)
	}
	return nil
}
