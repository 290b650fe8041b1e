package node

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// reconcilePolicyReport brings this node's entry of a policy's
// status.nodes up to what egressApplied holds, once every Machine of the
// node that the policy selects has been reconciled against its current
// generation.
func (a *Agent) reconcilePolicyReport(ctx context.Context, key types.NamespacedName) error {
	p := &kaironv1.MachineNetworkPolicy{}
	if err := a.client.Get(ctx, key, p); err != nil {
		if apierrors.IsNotFound(err) {
			a.egressReported.forget(key)
			return nil
		}
		return err
	}
	machines, errs, ready := a.egressApplied.entry(p, a.attachedMachinesOf(ctx, p))
	if !ready {
		return nil
	}
	return a.reportEgress(ctx, p, machines, errs)
}

// attachedMachinesOf names the Machines of this node that p selects and
// that have an address here: those whose rules p's entry must wait for.
func (a *Agent) attachedMachinesOf(ctx context.Context, p *kaironv1.MachineNetworkPolicy) []string {
	var names []string
	for _, m := range a.machinesOf(ctx, p) {
		if _, ok := a.egressTarget(m); ok {
			names = append(names, m.Name)
		}
	}
	return names
}

// reportEgress writes this node's entry of the policy's status.nodes with
// server-side apply under a field manager of its own, so that the agents of
// several nodes never overwrite each other's entries. A node with nothing
// to report removes its entry.
func (a *Agent) reportEgress(ctx context.Context, p *kaironv1.MachineNetworkPolicy, machines, errs []string) error {
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
	case a.egressReported.wrote(p, want, none):
		// The cache has yet to show this agent's last write, which
		// already says this: writing it again is a write for nothing on
		// the path of every egress bind.
		return nil
	}
	key := client.ObjectKeyFromObject(p)
	began := time.Now()
	err := writeEgressEntry(ctx, a.client, a.mgr.GetAPIReader(), p, want, none)
	observeSince(egressReportDuration, a.opts.NodeName, began)
	if err != nil {
		a.egressReported.forget(key)
		return client.IgnoreNotFound(err)
	}
	a.egressReported.record(p, want, none)
	return nil
}

// writeEgressEntry writes want as its node's entry of p's status.nodes
// (none: removes it) by server-side apply, and with it status.machines,
// the number of Machines all entries list, counting the other nodes'
// entries as p shows them: for the usual policy, which only this node
// reports on, the count needs no second write. A refusal (403) is most
// likely that count, from a view of the other entries that was behind
// (the confinement policy takes only their true sum): the policy is read
// live and the write made again, twice at most.
func writeEgressEntry(ctx context.Context, c client.Client, live client.Reader, p *kaironv1.MachineNetworkPolicy, want kaironv1.PolicyEnforcement, none bool) error {
	err := applyEgressEntry(ctx, c, p, want, none)
	for range 2 {
		if !apierrors.IsForbidden(err) {
			break
		}
		fresh := &kaironv1.MachineNetworkPolicy{}
		if err = live.Get(ctx, client.ObjectKeyFromObject(p), fresh); err != nil {
			break
		}
		err = applyEgressEntry(ctx, c, fresh, want, none)
	}
	return err
}

func applyEgressEntry(ctx context.Context, c client.Client, p *kaironv1.MachineNetworkPolicy, want kaironv1.PolicyEnforcement, none bool) error {
	count := 0
	for _, n := range p.Status.Nodes {
		if n.Node != want.Node {
			count += len(n.Machines)
		}
	}
	status := map[string]any{}
	if none {
		status["nodes"] = []any{}
	} else {
		status["nodes"] = []kaironv1.PolicyEnforcement{want}
		count += len(want.Machines)
	}
	status["machines"] = count
	body, err := json.Marshal(map[string]any{
		"apiVersion": kaironv1.GroupVersion.String(),
		"kind":       "MachineNetworkPolicy",
		"metadata":   map[string]any{"name": p.Name, "namespace": p.Namespace},
		"status":     status,
	})
	if err != nil {
		return err
	}
	return c.Status().Patch(ctx, p.DeepCopy(), client.RawPatch(types.ApplyPatchType, body),
		client.FieldOwner("kairon-node/"+want.Node), client.ForceOwnership)
}

func sameEnforcement(a, b kaironv1.PolicyEnforcement) bool {
	return slices.Equal(a.Machines, b.Machines) && a.ObservedGeneration == b.ObservedGeneration && a.Error == b.Error
}

// egressReports remembers this agent's last status.nodes entry per policy.
type egressReports struct {
	mu      sync.Mutex
	entries map[types.NamespacedName]egressReport
}

type egressReport struct {
	uid   types.UID
	entry kaironv1.PolicyEnforcement
	none  bool // the entry was removed
}

// wrote tells whether this agent's last write of p's entry, to this very
// policy (not an earlier one of the same name), said the same.
func (r *egressReports) wrote(p *kaironv1.MachineNetworkPolicy, want kaironv1.PolicyEnforcement, none bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	last, ok := r.entries[client.ObjectKeyFromObject(p)]
	return ok && last.uid == p.UID && last.none == none && (none || sameEnforcement(last.entry, want))
}

func (r *egressReports) record(p *kaironv1.MachineNetworkPolicy, entry kaironv1.PolicyEnforcement, none bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.entries == nil {
		r.entries = map[types.NamespacedName]egressReport{}
	}
	r.entries[client.ObjectKeyFromObject(p)] = egressReport{uid: p.UID, entry: entry, none: none}
}

// forget drops what was written for a policy: its write failed, or the
// policy is gone.
func (r *egressReports) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.entries, key)
}
