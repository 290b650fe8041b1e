package node

import (
	"fmt"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// egressApplied is what the agent last applied to each of its Machines:
// which policies, at which generation, and whether that failed. Each
// Machine is reconciled on its own, and a policy's status entry is read
// from here, so that a change of one Machine or one policy costs the
// agent that Machine or that policy, not a walk of the namespace.
type egressApplied struct {
	mu       sync.Mutex
	machines map[types.NamespacedName]appliedEgress
	// byPolicy: policy → names of the Machines whose record holds it.
	byPolicy map[types.NamespacedName]map[string]struct{}
	// epochs counts, per namespace, the policy changes seen: a Machine
	// whose reconcile read the policies before a change and records after
	// it reconciles again (see set).
	epochs map[string]uint64
}

// appliedEgress is one Machine's record.
type appliedEgress struct {
	policies []appliedPolicy // sorted by name
	// err, when set, says the policies are not in force on the Machine.
	err string
}

type appliedPolicy struct {
	name       string
	uid        types.UID
	generation int64
}

func appliedPolicyOf(p *kaironv1.MachineNetworkPolicy) appliedPolicy {
	return appliedPolicy{name: p.Name, uid: p.UID, generation: p.Generation}
}

func (r appliedEgress) equal(o appliedEgress) bool {
	return r.err == o.err && slices.Equal(r.policies, o.policies)
}

func (r appliedEgress) names() []string {
	names := make([]string, len(r.policies))
	for i, p := range r.policies {
		names[i] = p.name
	}
	return names
}

// epoch is the count of policy changes seen in namespace so far.
func (e *egressApplied) epoch(namespace string) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.epochs[namespace]
}

// policyChanged counts a change of policy (created, deleted, a new
// generation) and returns the Machines whose record holds it: they must
// be reconciled again.
func (e *egressApplied) policyChanged(policy types.NamespacedName) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.epochs == nil {
		e.epochs = map[string]uint64{}
	}
	e.epochs[policy.Namespace]++
	var names []string
	for name := range e.byPolicy[policy] {
		names = append(names, name)
	}
	return names
}

// set records what was applied to machine after a reconcile that read the
// policies at epoch. It returns the policies whose status entry may have
// changed (those of the old record and the new, when they differ), and
// stale when a policy changed since epoch: the reconcile may have read a
// policy as it was, and must run again.
func (e *egressApplied) set(machine types.NamespacedName, rec appliedEgress, epoch uint64) (changed []string, stale bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	stale = e.epochs[machine.Namespace] != epoch
	old, had := e.machines[machine]
	if had && old.equal(rec) {
		return nil, stale
	}
	if e.machines == nil {
		e.machines = map[types.NamespacedName]appliedEgress{}
		e.byPolicy = map[types.NamespacedName]map[string]struct{}{}
	}
	e.unindex(machine, old)
	e.machines[machine] = rec
	for _, p := range rec.policies {
		key := types.NamespacedName{Namespace: machine.Namespace, Name: p.name}
		if e.byPolicy[key] == nil {
			e.byPolicy[key] = map[string]struct{}{}
		}
		e.byPolicy[key][machine.Name] = struct{}{}
	}
	if !had {
		// A Machine reconciled for the first time: its policies' entries
		// may have waited for it (entry), even if it has none.
		return rec.names(), stale
	}
	return union(old.names(), rec.names()), stale
}

// drop forgets machine (gone, or no longer attached here) and returns the
// policies whose entry listed it.
func (e *egressApplied) drop(machine types.NamespacedName) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	old, ok := e.machines[machine]
	if !ok {
		return nil
	}
	e.unindex(machine, old)
	delete(e.machines, machine)
	return old.names()
}

func (e *egressApplied) unindex(machine types.NamespacedName, rec appliedEgress) {
	for _, p := range rec.policies {
		key := types.NamespacedName{Namespace: machine.Namespace, Name: p.name}
		delete(e.byPolicy[key], machine.Name)
		if len(e.byPolicy[key]) == 0 {
			delete(e.byPolicy, key)
		}
	}
}

// entry computes this node's status entry of p: the Machines whose record
// holds p at its current generation and applied without error, and the
// errors of those that failed. selected are the node's attached Machines
// that p selects now; ready is false while one of them has not yet been
// reconciled against p's current generation, so that an entry never
// drops a Machine for the moment between a policy's change and that
// Machine's reconcile (after an agent restart, or an edit of a policy
// that selects several Machines). That Machine's reconcile asks for the
// entry again.
func (e *egressApplied) entry(p *kaironv1.MachineNetworkPolicy, selected []string) (machines, errs []string, ready bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	want := appliedPolicyOf(p)
	current := func(name string) (appliedEgress, bool) {
		rec, ok := e.machines[types.NamespacedName{Namespace: p.Namespace, Name: name}]
		return rec, ok && slices.Contains(rec.policies, want)
	}
	for _, name := range selected {
		if _, ok := current(name); !ok {
			return nil, nil, false
		}
	}
	for name := range e.byPolicy[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] {
		rec, ok := current(name)
		switch {
		case !ok:
		case rec.err != "":
			errs = append(errs, fmt.Sprintf("%s: %s", name, rec.err))
		default:
			machines = append(machines, name)
		}
	}
	slices.Sort(machines)
	slices.Sort(errs)
	return machines, errs, true
}

func union(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}
