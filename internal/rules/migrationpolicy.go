package rules

import (
	"context"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// This file is the one place that decides which MigrationPolicy governs a
// Machine's migrations, what that policy's values come to for the
// Machine, and whether its parallel limits let a migration start now.
// kairon-controller calls it when it starts a migration, and `kaironctl
// describe migrationpolicy` to show which policy wins for each Machine.
//
// Selection, as KubeVirt's MigrationPolicy:
//
//   - A policy selects a Machine when the Machine carries every label of
//     spec.selectors.machineSelector and the Machine's namespace every
//     label of spec.selectors.namespaceSelector. An empty selector places
//     no condition: a policy with neither selects every Machine.
//   - Of the policies that select a Machine, the one with the most labels
//     in its two selectors together wins (the most specific).
//   - A tie goes to the policy whose name sorts first (plain byte order),
//     so the choice does not depend on the order the API server lists them.

// MigrationPolicyScore says whether p selects a Machine with machineLabels
// in a namespace with namespaceLabels, and with how many labels.
func MigrationPolicyScore(p *kaironv1.MigrationPolicy, machineLabels, namespaceLabels map[string]string) (score int, selects bool) {
	for _, sel := range []struct{ want, have map[string]string }{
		{p.Spec.Selectors.MachineSelector, machineLabels},
		{p.Spec.Selectors.NamespaceSelector, namespaceLabels},
	} {
		for k, v := range sel.want {
			if got, ok := sel.have[k]; !ok || got != v {
				return 0, false
			}
		}
		score += len(sel.want)
	}
	return score, true
}

// SelectMigrationPolicy is the policy that governs a Machine with
// machineLabels in a namespace with namespaceLabels, or nil when none
// selects it.
func SelectMigrationPolicy(policies []kaironv1.MigrationPolicy, machineLabels, namespaceLabels map[string]string) *kaironv1.MigrationPolicy {
	var best *kaironv1.MigrationPolicy
	bestScore := -1
	for i := range policies {
		p := &policies[i]
		score, ok := MigrationPolicyScore(p, machineLabels, namespaceLabels)
		if !ok {
			continue
		}
		if score > bestScore || (score == bestScore && p.Name < best.Name) {
			best, bestScore = p, score
		}
	}
	return best
}

// gib is a GiB in bytes.
const gib = 1 << 30

// ApplyMigrationPolicy is what policy p comes to for machine: the values a
// migration records in status.migrationPolicy. completionTimeoutPerGiB is
// multiplied by the Machine's memory in GiB and rounded up to a second.
func ApplyMigrationPolicy(p *kaironv1.MigrationPolicy, machine *kaironv1.Machine) *kaironv1.AppliedMigrationPolicy {
	if p == nil {
		return nil
	}
	applied := &kaironv1.AppliedMigrationPolicy{Name: p.Name}
	if b := p.Spec.BandwidthPerMigration; b != nil {
		q := b.DeepCopy()
		applied.BandwidthPerMigration = &q
	}
	if per := p.Spec.CompletionTimeoutPerGiB; per != nil {
		memory := MachineMemory(machine)
		bytes := memory.Value()
		// per × bytes / GiB, rounded up, without overflow for any memory
		// a node has (per ≤ 86400, bytes < 2^63 / 86400 ≈ 100 PiB).
		seconds := max((*per*bytes+gib-1)/gib, 1)
		applied.CompletionTimeoutSeconds = &seconds
	}
	if t := p.Spec.ProgressTimeout; t != nil {
		v := *t
		applied.ProgressTimeoutSeconds = &v
	}
	if a := p.Spec.AllowAutoConverge; a != nil {
		v := *a
		applied.AllowAutoConverge = &v
	}
	return applied
}

// MigrationParallelLimit says why policy p keeps a migration off node
// source from starting now, given the migrations Running in the cluster
// (of any policy, or none), or "" when it may start. A migration counts
// against maxParallelOutboundPerNode when its status.sourceNode is source.
func MigrationParallelLimit(p *kaironv1.MigrationPolicy, source string, running []*kaironv1.MachineMigration) string {
	if p == nil {
		return ""
	}
	if limit := p.Spec.MaxParallelMigrations; limit != nil && len(running) >= int(*limit) {
		return fmt.Sprintf("MigrationPolicy %s allows %d migrations at once in the cluster (maxParallelMigrations) and %d are Running; waiting for one to end",
			p.Name, *limit, len(running))
	}
	if limit := p.Spec.MaxParallelOutboundPerNode; limit != nil {
		out := 0
		for _, m := range running {
			if m.Status.SourceNode == source {
				out++
			}
		}
		if out >= int(*limit) {
			return fmt.Sprintf("MigrationPolicy %s allows %d migrations at once out of one node (maxParallelOutboundPerNode) and %d are Running out of node %s; waiting for one to end",
				p.Name, *limit, out, source)
		}
	}
	return ""
}

// PolicyReceipt is one Machine a MigrationPolicy selects, and the policy
// that governs it: the described one or another that wins over it.
type PolicyReceipt struct {
	Namespace, Name string
	// Winner is the policy that governs the Machine's migrations.
	Winner string
	// Score is the described policy's, WinnerScore the winner's.
	Score, WinnerScore int
}

// MigrationPolicyReceipts lists the Machines policy name selects, sorted
// by namespace and name, each with the policy that wins for it among
// policies (which holds the described one).
func MigrationPolicyReceipts(name string, policies []kaironv1.MigrationPolicy, machines []kaironv1.Machine, namespaceLabels map[string]map[string]string) []PolicyReceipt {
	var described *kaironv1.MigrationPolicy
	for i := range policies {
		if policies[i].Name == name {
			described = &policies[i]
		}
	}
	if described == nil {
		return nil
	}
	var out []PolicyReceipt
	for i := range machines {
		m := &machines[i]
		nsLabels := namespaceLabels[m.Namespace]
		score, ok := MigrationPolicyScore(described, m.Labels, nsLabels)
		if !ok {
			continue
		}
		winner := SelectMigrationPolicy(policies, m.Labels, nsLabels)
		winnerScore, _ := MigrationPolicyScore(winner, m.Labels, nsLabels)
		out = append(out, PolicyReceipt{Namespace: m.Namespace, Name: m.Name, Winner: winner.Name, Score: score, WinnerScore: winnerScore})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// LoadMigrationPolicyReceipts reads the policies, Machines and namespaces
// and returns MigrationPolicyReceipts for policy name.
func LoadMigrationPolicyReceipts(ctx context.Context, c client.Reader, name string) ([]PolicyReceipt, error) {
	var policies kaironv1.MigrationPolicyList
	if err := c.List(ctx, &policies); err != nil {
		return nil, fmt.Errorf("listing migration policies: %w", err)
	}
	var machines kaironv1.MachineList
	if err := c.List(ctx, &machines); err != nil {
		return nil, fmt.Errorf("listing machines: %w", err)
	}
	var namespaces corev1.NamespaceList
	if err := c.List(ctx, &namespaces); err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	nsLabels := make(map[string]map[string]string, len(namespaces.Items))
	for _, ns := range namespaces.Items {
		nsLabels[ns.Name] = ns.Labels
	}
	return MigrationPolicyReceipts(name, policies.Items, machines.Items, nsLabels), nil
}
