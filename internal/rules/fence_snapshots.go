package rules

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// loadFenceSnapshots is the newest Ready MachineSnapshot of each of
// machines, by "namespace/name".
func loadFenceSnapshots(ctx context.Context, reader client.Reader, machines []*kaironv1.Machine) (map[string]FenceSnapshot, error) {
	if len(machines) == 0 {
		return nil, nil
	}
	namespaces := map[string]bool{}
	for _, m := range machines {
		namespaces[m.Namespace] = true
	}
	ready := map[string][]FenceSnapshot{}
	for ns := range namespaces {
		var list kaironv1.MachineSnapshotList
		if err := reader.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return nil, fmt.Errorf("listing machinesnapshots in namespace %s: %w", ns, err)
		}
		for i := range list.Items {
			s := &list.Items[i]
			if s.Status.Phase != kaironv1.SnapshotReady || s.DeletionTimestamp != nil {
				continue
			}
			taken := s.CreationTimestamp.Time
			if s.Status.TakenAt != nil {
				taken = s.Status.TakenAt.Time
			}
			key := s.Namespace + "/" + s.Spec.MachineName
			ready[key] = append(ready[key], FenceSnapshot{Name: s.Name, TakenAt: taken, Store: s.Status.Store})
		}
	}
	return NewestFenceSnapshots(ready), nil
}
