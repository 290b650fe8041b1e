package controller

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// The cache's indexes of Machines. A label selector on a cached list reads
// every Machine of the namespace; these are looked up instead. Without
// them, at 5,000 Machines and 2,000 claims in one namespace, every claim's
// reconcile and every pool's and binder's pass read all 5,000, which kept
// kairon-controller busy for minutes after a restart (docs/benchmarks.md,
// "Scale").
const (
	// claimedMachineIndex: claimed Machines by the claim their labels name.
	claimedMachineIndex = "kairon.claimedBy"
	// poolMachineIndex: Machines by the pool their labels name, warm and
	// claimed alike.
	poolMachineIndex = "kairon.pool"
	// poolUnclaimedMachineIndex: the same without the claimed ones, which
	// pile up as a pool serves claims and which the binder, looking for a
	// member to hand out, has no use for.
	poolUnclaimedMachineIndex = "kairon.poolUnclaimed"
)

func indexMachines(mgr manager.Manager) error {
	indexer := mgr.GetFieldIndexer()
	if err := indexer.IndexField(context.Background(), &kaironv1.Machine{}, claimedMachineIndex, claimOfClaimedMachine); err != nil {
		return fmt.Errorf("indexing machines by claim: %w", err)
	}
	if err := indexer.IndexField(context.Background(), &kaironv1.Machine{}, poolMachineIndex, poolOfMember); err != nil {
		return fmt.Errorf("indexing machines by pool: %w", err)
	}
	if err := indexer.IndexField(context.Background(), &kaironv1.Machine{}, poolUnclaimedMachineIndex, poolOfUnclaimedMember); err != nil {
		return fmt.Errorf("indexing unclaimed machines by pool: %w", err)
	}
	return nil
}

func claimOfClaimedMachine(o client.Object) []string {
	labels := o.GetLabels()
	if labels[kaironv1.LabelPoolState] != kaironv1.PoolStateClaimed || labels[kaironv1.LabelMachineClaim] == "" {
		return nil
	}
	return []string{labels[kaironv1.LabelMachineClaim]}
}

func poolOfMember(o client.Object) []string {
	if pool := o.GetLabels()[kaironv1.LabelMachinePool]; pool != "" {
		return []string{pool}
	}
	return nil
}

func poolOfUnclaimedMember(o client.Object) []string {
	if o.GetLabels()[kaironv1.LabelPoolState] == kaironv1.PoolStateClaimed {
		return nil
	}
	return poolOfMember(o)
}
