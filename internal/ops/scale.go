package ops

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Scale sets spec.replicas of obj (a MachineSet or MachinePool, only its
// namespace and name read) through its scale subresource, as kubectl scale
// and a HorizontalPodAutoscaler do, so RBAC on the subresource decides.
// Checking replicas is the caller's: each words its own refusal.
func Scale(ctx context.Context, c client.Client, obj client.Object, replicas int32) error {
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas))
	return c.SubResource("scale").Patch(ctx, obj, patch)
}
