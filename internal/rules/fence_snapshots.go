package rules

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// loadFenceSnapshots is the newest Ready MachineSnapshot of each of
// machines (NewestReadySnapshot), by "namespace/name".
func loadFenceSnapshots(ctx context.Context, reader client.Reader, machines []*kaironv1.Machine) (map[string]FenceSnapshot, error) {
	lists := map[string][]kaironv1.MachineSnapshot{}
	out := map[string]FenceSnapshot{}
	for _, m := range machines {
		snaps, ok := lists[m.Namespace]
		if !ok {
			var list kaironv1.MachineSnapshotList
			if err := reader.List(ctx, &list, client.InNamespace(m.Namespace)); err != nil {
				return nil, fmt.Errorf("listing machinesnapshots in namespace %s: %w", m.Namespace, err)
			}
			snaps = list.Items
			lists[m.Namespace] = snaps
		}
		if s := NewestReadySnapshot(snaps, m.Namespace, m.Name); s != nil {
			out[m.Namespace+"/"+m.Name] = FenceSnapshot{Name: s.Name, TakenAt: SnapshotTime(s), Store: s.Status.Store}
		}
	}
	return out, nil
}
